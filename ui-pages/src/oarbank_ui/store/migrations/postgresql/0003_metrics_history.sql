-- What a heartbeat says about the node's memory and GPU (read when the report has it), each
-- service's resident memory and load count, and the bounded history the nodes and
-- node_metrics queries read: one sample per node, module, service and time bucket (res_s
-- wide), fine buckets first, rolled up into coarse ones as they age (store/history.py).
ALTER TABLE nodes ADD COLUMN mem_used_bytes BIGINT;
ALTER TABLE nodes ADD COLUMN mem_reserved_bytes BIGINT;
ALTER TABLE nodes ADD COLUMN mem_total_bytes BIGINT;
ALTER TABLE nodes ADD COLUMN gpu_mem_used_bytes BIGINT;
ALTER TABLE nodes ADD COLUMN gpu_mem_total_bytes BIGINT;
ALTER TABLE service_rows ADD COLUMN rss_bytes BIGINT;
ALTER TABLE service_rows ADD COLUMN loads BIGINT;
CREATE TABLE node_samples (
    module              TEXT NOT NULL,
    node_id             TEXT NOT NULL,
    service             TEXT NOT NULL,
    res_s               BIGINT NOT NULL,
    t                   DOUBLE PRECISION NOT NULL,
    hostname            TEXT NOT NULL,
    running             BIGINT NOT NULL,
    ready               BIGINT NOT NULL,
    users               BIGINT NOT NULL,
    rss_bytes           BIGINT,
    loads               BIGINT,
    mem_used_bytes      BIGINT,
    mem_reserved_bytes  BIGINT,
    gpu_mem_used_bytes  BIGINT,
    samples             BIGINT NOT NULL,
    PRIMARY KEY (module, node_id, service, res_s, t)
);
-- the fleet over time (group_by t), read from the index alone; one node over time
CREATE INDEX node_samples_by_time ON node_samples (module, t, running, ready, users, node_id);
CREATE INDEX node_samples_by_node ON node_samples (module, node_id, t);
