-- 000001_init: the core schema of bmdb.
--
-- Compatibility: this is the first migration; no older binary exists.
-- Every statement runs unchanged on CockroachDB and PostgreSQL but the
-- CREATE TYPE, which neither engine runs twice as written and which they
-- make idempotent differently (CREATE TYPE IF NOT EXISTS on CockroachDB,
-- which PostgreSQL and sqlc lack): bmdb runs it in the engine's idempotent
-- form (migrations/types.go).
-- bmdb:rerunnable (safe to run again from any partial state; see migrations.go)

-- machines are the items that workers claim. Applications describe a
-- machine's state in tag tables of their own, keyed by machine_id.
CREATE TABLE IF NOT EXISTS machines (
    machine_id UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    machine_created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- sessions are heartbeated rows, one per live component instance. A session
-- is alive while deadline > now() on the database clock.
CREATE TABLE IF NOT EXISTS sessions (
    session_id UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    component_name TEXT NOT NULL CHECK (length(component_name) BETWEEN 1 AND 255),
    runtime_info TEXT NOT NULL CHECK (length(runtime_info) <= 4096),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    interval_seconds FLOAT8 NOT NULL CHECK (interval_seconds > 0),
    deadline TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_deadline_idx ON sessions (deadline);

-- work holds the claims. The primary key is the claim: two claims of the same
-- (machine, process) cannot both commit. A claim dies with its session.
CREATE TABLE IF NOT EXISTS work (
    machine_id UUID NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    process TEXT NOT NULL CHECK (length(process) BETWEEN 1 AND 128),
    session_id UUID NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (machine_id, process)
);
CREATE INDEX IF NOT EXISTS work_session_id_idx ON work (session_id);

CREATE TYPE work_history_event AS ENUM ('Started', 'Finished', 'Canceled', 'Failed', 'Abandoned');

-- work_history is the audit log of every claim. It has no foreign keys: it
-- outlives sessions and machines.
CREATE TABLE IF NOT EXISTS work_history (
    id BIGSERIAL PRIMARY KEY,
    machine_id UUID NOT NULL,
    process TEXT NOT NULL,
    session_id UUID NOT NULL,
    event work_history_event NOT NULL,
    at TIMESTAMPTZ NOT NULL DEFAULT now(),
    failed_cause TEXT
);
CREATE INDEX IF NOT EXISTS work_history_machine_idx ON work_history (machine_id, at);
CREATE INDEX IF NOT EXISTS work_history_process_idx ON work_history (process, event, at);

-- work_backoff keeps a failed (machine, process) away from retrieval until
-- "until". The row stays after it expires so that the next failure grows the
-- interval; a later Finish deletes it.
CREATE TABLE IF NOT EXISTS work_backoff (
    machine_id UUID NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    process TEXT NOT NULL CHECK (length(process) BETWEEN 1 AND 128),
    until TIMESTAMPTZ NOT NULL,
    cause TEXT NOT NULL,
    interval_seconds FLOAT8 NOT NULL CHECK (interval_seconds > 0),
    PRIMARY KEY (machine_id, process)
);
CREATE INDEX IF NOT EXISTS work_backoff_process_until_idx ON work_backoff (process, until);
