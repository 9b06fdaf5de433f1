"""The store's two tables of reports as the code writes and reads them: a node's row (its last
report's head and metrics) and its service rows, in column order, and the upsert that keeps a
node's later report (contract 6.2: reports are ordered by the portal's receipt)."""

from __future__ import annotations

__all__ = ["NODE_COLUMNS", "NODE_WON", "ROW_COLUMNS", "services_sql"]

NODE_COLUMNS = ("node_id, hostname, reported_at, received_at, heartbeat_s, agent_stopped,"
                " mem_used_bytes, mem_reserved_bytes, mem_total_bytes, gpu_mem_used_bytes,"
                " gpu_mem_total_bytes, rows_digest")
# A node's report replaces the stored one only if it was received no earlier (the order of
# reports is the order they reached the portal); the node ids it replaced come back.
NODE_WON = (" ON CONFLICT (node_id) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in NODE_COLUMNS.split(", ")[1:])
            + " WHERE nodes.received_at <= excluded.received_at RETURNING node_id")
ROW_COLUMNS = ("module, node_id, service, hostname, health, running, ready, accepting, error,"
               " held, disabled, withdrawn, gpu_api_missing, lifecycle, users, endpoint,"
               " reported_at, raw, received_at, heartbeat_s, agent_stopped, rss_bytes, loads")
# A service row's liveness is its node's: a report that says nothing new refreshes only the
# node's times (write.py), so readers take ``reported_at`` and ``received_at`` from ``nodes``;
# the rows' own two columns say when the rows themselves were last written.
_ROW_OWN_COLUMNS = ", ".join(c for c in ROW_COLUMNS.split(", ")
                             if c not in ("reported_at", "received_at"))


def services_sql(where: str) -> str:
    """The ``services`` query's rows (``where`` on service_rows' columns; then ORDER BY and a
    LIMIT parameter), each with its node's times. The page of rows is cut first, through the
    primary key, and only its rows look their node up, by the node's key: a join before the
    LIMIT, or a hash join after it, may read every node."""
    node = "(SELECT n.{0} FROM nodes n WHERE n.node_id = s.node_id) AS {0}"
    return (f"SELECT {_ROW_OWN_COLUMNS}, {node.format('reported_at')},"
            f" {node.format('received_at')} FROM (SELECT * FROM service_rows WHERE {where}"
            " ORDER BY node_id, service LIMIT ?) s ORDER BY node_id, service")
