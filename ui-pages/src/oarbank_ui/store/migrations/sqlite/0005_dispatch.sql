-- Fleet dispatch (contract section 10): submitters, batches, jobs, their attempts (leases),
-- and each node's latest claim (what placement reads of the fleet's warmth).
CREATE TABLE submitters (
    name       TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL UNIQUE,
    issued_at  REAL NOT NULL
);
CREATE TABLE job_batches (
    batch_id        TEXT PRIMARY KEY,
    submitter       TEXT NOT NULL,
    idempotency_key TEXT,
    digest          TEXT NOT NULL,
    jobs            INTEGER NOT NULL,
    submitted_at    REAL NOT NULL,
    UNIQUE (submitter, idempotency_key)
);
CREATE TABLE jobs (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id         TEXT NOT NULL UNIQUE,
    batch_id       TEXT NOT NULL,
    submitter      TEXT NOT NULL,
    module         TEXT NOT NULL,
    stage          TEXT NOT NULL,
    payload        TEXT NOT NULL,
    state          TEXT NOT NULL,
    submitted_at   REAL NOT NULL,
    started_at     REAL,
    finished_at    REAL,
    expires_at     REAL,
    generation     INTEGER NOT NULL DEFAULT 0,
    attempt_id     INTEGER,
    node_id        TEXT,
    placement      TEXT,
    lease_expiries INTEGER NOT NULL DEFAULT 0,
    record         TEXT,
    result         TEXT
);
CREATE INDEX jobs_queue ON jobs (module, stage, seq) WHERE state = 'queued';
CREATE INDEX jobs_batch ON jobs (batch_id, seq);
CREATE INDEX jobs_module ON jobs (module, state);
CREATE INDEX jobs_expiry ON jobs (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE attempts (
    attempt_id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id     TEXT NOT NULL,
    generation INTEGER NOT NULL,
    node_id    TEXT NOT NULL,
    module     TEXT NOT NULL,
    stage      TEXT NOT NULL,
    placement  TEXT NOT NULL,
    state      TEXT NOT NULL,
    issued_at  REAL NOT NULL,
    expires_at REAL NOT NULL,
    ended_at   REAL,
    answer     TEXT
);
CREATE INDEX attempts_live ON attempts (expires_at) WHERE state = 'running';
CREATE INDEX attempts_job ON attempts (job_id);
CREATE INDEX attempts_node ON attempts (node_id, state);
CREATE TABLE claim_offers (
    node_id    TEXT NOT NULL,
    module     TEXT NOT NULL,
    service    TEXT NOT NULL,
    state      TEXT NOT NULL,
    tokens     INTEGER NOT NULL,
    load_s     REAL,
    job_s      REAL,
    claimed_at REAL NOT NULL,
    PRIMARY KEY (node_id, module, service)
);
CREATE INDEX claim_offers_module ON claim_offers (module, state);
