-- Node credentials (only the token's hash is kept) and what liveness needs per row: when the
-- portal received the report, the node's period, and whether it was the agent's last one.
CREATE TABLE node_tokens (
    node_id    TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL UNIQUE,
    issued_at  REAL NOT NULL
);
ALTER TABLE nodes ADD COLUMN heartbeat_s REAL NOT NULL DEFAULT 10;
ALTER TABLE nodes ADD COLUMN agent_stopped INTEGER NOT NULL DEFAULT 0;
ALTER TABLE service_rows ADD COLUMN received_at REAL NOT NULL DEFAULT 0;
ALTER TABLE service_rows ADD COLUMN heartbeat_s REAL NOT NULL DEFAULT 10;
ALTER TABLE service_rows ADD COLUMN agent_stopped INTEGER NOT NULL DEFAULT 0;
UPDATE service_rows SET received_at = (SELECT n.received_at FROM nodes n
                                       WHERE n.node_id = service_rows.node_id);
