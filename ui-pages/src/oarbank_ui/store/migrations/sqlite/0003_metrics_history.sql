-- What a heartbeat says about the node's memory and GPU (read when the report has it), each
-- service's resident memory and load count, and the bounded history the nodes and
-- node_metrics queries read: one sample per node, module, service and time bucket (res_s
-- wide), fine buckets first, rolled up into coarse ones as they age (store/history.py).
ALTER TABLE nodes ADD COLUMN mem_used_bytes INTEGER;
ALTER TABLE nodes ADD COLUMN mem_reserved_bytes INTEGER;
ALTER TABLE nodes ADD COLUMN mem_total_bytes INTEGER;
ALTER TABLE nodes ADD COLUMN gpu_mem_used_bytes INTEGER;
ALTER TABLE nodes ADD COLUMN gpu_mem_total_bytes INTEGER;
ALTER TABLE service_rows ADD COLUMN rss_bytes INTEGER;
ALTER TABLE service_rows ADD COLUMN loads INTEGER;
CREATE TABLE node_samples (
    module              TEXT NOT NULL,
    node_id             TEXT NOT NULL,
    service             TEXT NOT NULL,
    res_s               INTEGER NOT NULL,
    t                   REAL NOT NULL,
    hostname            TEXT NOT NULL,
    running             INTEGER NOT NULL,
    ready               INTEGER NOT NULL,
    users               INTEGER NOT NULL,
    rss_bytes           INTEGER,
    loads               INTEGER,
    mem_used_bytes      INTEGER,
    mem_reserved_bytes  INTEGER,
    gpu_mem_used_bytes  INTEGER,
    samples             INTEGER NOT NULL,
    PRIMARY KEY (module, node_id, service, res_s, t)
);
-- the fleet over time (group_by t), read from the index alone; one node over time
CREATE INDEX node_samples_by_time ON node_samples (module, t, running, ready, users, node_id);
CREATE INDEX node_samples_by_node ON node_samples (module, node_id, t);
