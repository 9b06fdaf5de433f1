-- The same tables as SQLite's 0001 (version numbers match across the two stores).
CREATE TABLE nodes (
    node_id     TEXT PRIMARY KEY,
    hostname    TEXT NOT NULL,
    reported_at DOUBLE PRECISION NOT NULL,
    received_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE service_rows (
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
    reported_at     DOUBLE PRECISION NOT NULL,
    raw             TEXT NOT NULL,
    PRIMARY KEY (module, node_id, service)
);
CREATE INDEX service_rows_by_node ON service_rows (node_id);
