-- The schema before versioned migrations (IF NOT EXISTS: a portal.db made by an older portal
-- already has it and is taken as it is).
CREATE TABLE IF NOT EXISTS nodes (
    node_id     TEXT PRIMARY KEY,
    hostname    TEXT NOT NULL,
    reported_at REAL NOT NULL,
    received_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS service_rows (
    module          TEXT NOT NULL,
    node_id         TEXT NOT NULL,
    service         TEXT NOT NULL,
    hostname        TEXT NOT NULL,
    health          TEXT,
    running         INTEGER NOT NULL,
    ready           INTEGER NOT NULL,
    accepting       INTEGER NOT NULL,
    error           TEXT,
    held            TEXT,
    disabled        INTEGER NOT NULL,
    withdrawn       INTEGER NOT NULL,
    gpu_api_missing INTEGER NOT NULL,
    lifecycle       TEXT NOT NULL,
    users           INTEGER NOT NULL,
    endpoint        INTEGER NOT NULL,
    reported_at     REAL NOT NULL,
    raw             TEXT NOT NULL,
    -- The primary key is the query's index: module first (always given), then the two
    -- optional filters in the order rows are returned.
    PRIMARY KEY (module, node_id, service)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS service_rows_by_node ON service_rows (node_id);
