-- One row per job per tick. `fence` is the CRON_FENCE of the run that wrote the row: the store
-- only lets a write from a newer leader (a larger fence) replace it.
CREATE TABLE IF NOT EXISTS reports (
    job    TEXT    NOT NULL,
    tick   TEXT    NOT NULL,   -- CRON_SCHEDULED_AT, RFC 3339 UTC
    fence  INTEGER NOT NULL,   -- CRON_FENCE
    node   TEXT    NOT NULL,   -- CRON_NODE
    body   TEXT    NOT NULL,
    PRIMARY KEY (job, tick)
);

-- Every write the job attempted, accepted or not: an audit trail to check the fence against.
CREATE TABLE IF NOT EXISTS attempts (
    job        TEXT    NOT NULL,
    tick       TEXT    NOT NULL,
    fence      INTEGER NOT NULL,
    node       TEXT    NOT NULL,
    shard      INTEGER NOT NULL,
    started_at REAL    NOT NULL,   -- the job's own clock when it started, Unix seconds
    accepted   INTEGER NOT NULL    -- 1 when the reports row now carries this write
);
