package chaos

// Process is the bmdb process name the chaos workers claim machines for.
const Process = "chaos"

// schemaSQL creates the harness's own tables in the test database, after
// bmdb migrated it:
//
//   - chaos_effect is the effect of processing an item, inserted by Finish's
//     commit. It is deliberately not unique per machine, so that a double
//     commit is detected by the checker rather than refused. It records the
//     session's deadline as the committing transaction saw it, the
//     transaction's now() and the statement's clock_timestamp(); the
//     checker adds the commit timestamp (track_commit_timestamp).
//   - chaos_session_log records every deadline a session row was given (by
//     a trigger on bmdb's sessions table, insert-only so it adds no
//     serialization conflicts), so that the checker knows each session's
//     final deadline after GC deleted the row.
//   - chaos_backoff_log records every until a (machine, process) was
//     given in work_backoff (a trigger, insert-only as the sessions' is),
//     with the writing transaction (its xmin is the Fail's, which wrote
//     the Failed history row), so that the checker knows when each
//     backoff ended (reclaim.go: which items were free).
//   - chaos_fault records the injected faults on the database clock.
const schemaSQL = `
CREATE TABLE chaos_effect (
    id BIGSERIAL PRIMARY KEY,
    machine_id UUID NOT NULL,
    session_id UUID NOT NULL,
    worker_id INT NOT NULL,
    claim_id UUID NOT NULL,
    token BIGINT NOT NULL,
    tx_now TIMESTAMPTZ NOT NULL,
    stmt_clock TIMESTAMPTZ NOT NULL,
    seen_deadline TIMESTAMPTZ
);
CREATE INDEX chaos_effect_machine_idx ON chaos_effect (machine_id);

CREATE TABLE chaos_session_log (
    session_id UUID NOT NULL,
    deadline TIMESTAMPTZ NOT NULL,
    at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX chaos_session_log_idx ON chaos_session_log (session_id);

CREATE FUNCTION chaos_log_session() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_session_log (session_id, deadline) VALUES (NEW.session_id, NEW.deadline);
    RETURN NULL;
END
$$;
CREATE TRIGGER chaos_log_session AFTER INSERT OR UPDATE OF deadline ON sessions
    FOR EACH ROW EXECUTE FUNCTION chaos_log_session();

CREATE TABLE chaos_backoff_log (
    machine_id UUID NOT NULL,
    process TEXT NOT NULL,
    until TIMESTAMPTZ NOT NULL
);

CREATE FUNCTION chaos_log_backoff() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_backoff_log (machine_id, process, until) VALUES (NEW.machine_id, NEW.process, NEW.until);
    RETURN NULL;
END
$$;
CREATE TRIGGER chaos_log_backoff AFTER INSERT OR UPDATE OF until ON work_backoff
    FOR EACH ROW EXECUTE FUNCTION chaos_log_backoff();

CREATE TABLE chaos_fault (
    id BIGSERIAL PRIMARY KEY,
    kind TEXT NOT NULL,
    target TEXT NOT NULL,
    began_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    ended_at TIMESTAMPTZ,
    detail TEXT NOT NULL DEFAULT ''
);
`

// workerRole is the role the workers connect as: not a superuser, so that
// its connection limit binds (FaultMaxConnections).
const workerRole = "chaos_worker"

// workerRoleSQL creates workerRole, with what bmdb's and the harness's
// tables need.
const workerRoleSQL = `
CREATE ROLE chaos_worker LOGIN;
GRANT ALL ON ALL TABLES IN SCHEMA public TO chaos_worker;
GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO chaos_worker;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO chaos_worker;
GRANT CREATE ON SCHEMA public TO chaos_worker;
CREATE FUNCTION chaos_limit_workers(n INT) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER ROLE chaos_worker CONNECTION LIMIT %s', n);
END
$$;
REVOKE EXECUTE ON FUNCTION chaos_limit_workers(INT) FROM PUBLIC, chaos_worker`

// limitWorkersSQL sets workerRole's connection limit to $1 (-1: none).
const limitWorkersSQL = `SELECT chaos_limit_workers($1)`

// Queries of the workers.
const (
	// retrieveSQL returns machines that have no effect yet and no claim held
	// by a live session (claims of expired sessions are taken over by Work),
	// oldest first. $1 is the process, $2 the limit.
	retrieveSQL = `
SELECT m.machine_id FROM machines m
WHERE NOT EXISTS (SELECT 1 FROM chaos_effect e WHERE e.machine_id = m.machine_id)
  AND NOT EXISTS (
        SELECT 1 FROM work w JOIN sessions s ON s.session_id = w.session_id
        WHERE w.machine_id = m.machine_id AND w.process = $1 AND s.deadline > now())
ORDER BY m.machine_created_at, m.machine_id
LIMIT $2`

	// insertEffectSQL records the effect of (machine $1, session $2, worker
	// $3) under claim $4 with fencing token $5.
	insertEffectSQL = `
INSERT INTO chaos_effect (machine_id, session_id, worker_id, claim_id, token, tx_now, stmt_clock, seen_deadline)
VALUES ($1, $2, $3, $4, $5, now(), clock_timestamp(),
        (SELECT s.deadline FROM sessions s WHERE s.session_id = $2))`
)

// Queries of the harness.
const (
	seedSQL = `INSERT INTO machines (machine_id) SELECT gen_random_uuid() FROM generate_series(1, $1::INT8)`

	progressSQL = `SELECT (SELECT count(*) FROM machines), (SELECT count(DISTINCT machine_id) FROM chaos_effect)`

	faultBeginSQL = `INSERT INTO chaos_fault (kind, target, detail) VALUES ($1, $2, $3) RETURNING id`
	faultEndSQL   = `UPDATE chaos_fault SET ended_at = now(), detail = $2 WHERE id = $1`

	// stuckSQL describes the items without effect and their claim.
	stuckSQL = `
SELECT m.machine_id, COALESCE(
         (SELECT 'claimed by session ' || w.session_id::TEXT || ' of ' || s.component_name || ' since ' || w.started_at::TEXT
                 || CASE WHEN s.deadline > now() THEN ', alive' ELSE ', expired' END
          FROM work w JOIN sessions s ON s.session_id = w.session_id
          WHERE w.machine_id = m.machine_id AND w.process = $1), 'not claimed')
FROM machines m
WHERE NOT EXISTS (SELECT 1 FROM chaos_effect e WHERE e.machine_id = m.machine_id)`

	terminateSQL = `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`

	enableCommitTSSQL = `ALTER SYSTEM SET track_commit_timestamp = on`
)
