-- name: WorkClaimStates :many
-- WorkClaimStates tells, for each of machine_ids, in their order, why it could
-- not be claimed for process: whether it is a machine at all, whether it
-- is in backoff, and which session
-- holds its claim (NULL: none) and whether that session is alive. A claim
-- being made by a transaction not yet committed is not seen: such a
-- machine has no holder here.
SELECT
    EXISTS (SELECT 1 FROM machines m WHERE m.machine_id = c.machine_id) AS known,
    EXISTS (
        SELECT 1 FROM work_backoff b
        WHERE b.machine_id = c.machine_id AND b.process = sqlc.arg(process)::TEXT
          AND b.until > now()
    ) AS in_backoff,
    w.session_id AS holder,
    COALESCE(s.deadline > statement_timestamp(), FALSE)::BOOLEAN AS holder_live
FROM unnest(sqlc.arg(machine_ids)::UUID[]) WITH ORDINALITY AS c (machine_id, ord)
LEFT JOIN work w ON w.machine_id = c.machine_id AND w.process = sqlc.arg(process)::TEXT
LEFT JOIN sessions s ON s.session_id = w.session_id
ORDER BY c.ord;

-- name: WorkEndSession :many
-- WorkEndSession removes every claim of a session, recording the given event
-- (Canceled when the session closes cleanly, Abandoned when it had expired),
-- and returns the process of each. The rows are dated by this statement's
-- clock, like the check that found the session expired (or alive).
WITH ended AS (
    DELETE FROM work WHERE work.session_id = sqlc.arg(session_id)
    RETURNING work.machine_id, work.process, work.session_id, work.claim_id
)
INSERT INTO work_history (machine_id, process, session_id, event, at, component_name, claim_id)
SELECT ended.machine_id, ended.process, ended.session_id, sqlc.arg(event)::work_history_event,
       statement_timestamp(), sqlc.arg(component_name)::TEXT, ended.claim_id
FROM ended
RETURNING work_history.process;

-- name: WorkAbandonOfSessions :many
-- WorkAbandonOfSessions removes every claim of the given (expired, locked)
-- sessions, recording Abandoned history with each claim's id, and returns
-- the process of each. GC and takeovers run it between SessionLock... and
-- SessionDeleteMany, in one transaction. The rows' time is this
-- statement's, not the transaction's start: the locks judged the sessions
-- expired by their statements' clock, so an Abandoned row is never dated
-- before its session's deadline.
WITH gone AS (
    DELETE FROM work
    WHERE work.session_id = ANY (sqlc.arg(session_ids)::UUID[])
    RETURNING work.machine_id, work.process, work.session_id, work.claim_id
)
INSERT INTO work_history (machine_id, process, session_id, event, at, component_name, claim_id)
SELECT gone.machine_id, gone.process, gone.session_id, 'Abandoned', statement_timestamp(),
       (SELECT s.component_name FROM sessions s WHERE s.session_id = gone.session_id), gone.claim_id
FROM gone
RETURNING work_history.process;

-- name: WorkGet :one
-- WorkGet returns the claim of (machine, process), live or not.
SELECT * FROM work
WHERE machine_id = sqlc.arg(machine_id) AND process = sqlc.arg(process);

-- name: WorkClaimMany :many
-- WorkClaimMany claims, in one statement, each of machine_ids that is
-- neither claimed for process nor in backoff for it, records Started for
-- each with its fencing token (work_fencing, one more than the previous
-- claim's), and returns the claimed machines with their claim ids and
-- tokens. Like every claim and end statement, it dates its rows by
-- statement_timestamp(), not by the transaction's start: sorted by time, a
-- machine's history is the order of its events.
--
-- It first locks the machines' rows, in id order, FOR NO KEY UPDATE SKIP
-- LOCKED, and claims only those it locked; the lock is held until the
-- transaction ends. So two transactions never claim the same machine at
-- once: the second skips it rather than wait for the first's uncommitted
-- claim (and then fail on it, or deadlock on another's). The lock does not
-- conflict with the KEY SHARE locks that foreign keys to machines take
-- (an application's tag rows, another claim's history row). Every claim
-- goes through this statement, so only a transaction claiming the machine
-- skips it. An id that is not a machine is not claimed either (Work then
-- finds out why with WorkClaimStates). A claim committed after this transaction's snapshot, which
-- the snapshot cannot see, fails it with 40001 (retried, with a snapshot
-- that sees it).
WITH locked AS (
    SELECT m.machine_id FROM machines m
    WHERE m.machine_id = ANY (sqlc.arg(machine_ids)::UUID[])
    ORDER BY m.machine_id
    FOR NO KEY UPDATE SKIP LOCKED
), claim AS (
    INSERT INTO work (machine_id, process, session_id, started_at)
    SELECT locked.machine_id, sqlc.arg(process)::TEXT, sqlc.arg(session_id)::UUID, statement_timestamp()
    FROM locked
    WHERE NOT EXISTS (
        SELECT 1 FROM work_backoff b
        WHERE b.machine_id = locked.machine_id AND b.process = sqlc.arg(process)::TEXT
          AND b.until > now()
    )
    ON CONFLICT (machine_id, process) DO NOTHING
    RETURNING machine_id, process, session_id, started_at, claim_id
), fence AS (
    INSERT INTO work_fencing (machine_id, process, token)
    SELECT claim.machine_id, claim.process, 1 FROM claim
    ON CONFLICT (machine_id, process) DO UPDATE SET token = work_fencing.token + 1
    RETURNING work_fencing.machine_id, work_fencing.token
)
INSERT INTO work_history (machine_id, process, session_id, event, at, component_name, claim_id, fencing_token)
SELECT claim.machine_id, claim.process, claim.session_id, 'Started', claim.started_at,
       sqlc.arg(component_name)::TEXT, claim.claim_id, fence.token
FROM claim JOIN fence ON fence.machine_id = claim.machine_id
RETURNING work_history.machine_id, work_history.claim_id, work_history.fencing_token;

-- name: WorkFinishMany :many
-- WorkFinishMany ends, as Finished, the claims claim_ids of process on
-- machine_ids that the session still holds, clears their backoffs, and
-- returns their claim ids: those missing were no longer held (the fence of
-- a batch's Finishes). Like every claim and end statement, it dates its
-- rows by statement_timestamp(), not by the transaction's start: sorted by
-- time, a machine's history is the order of its events (a takeover's
-- Abandoned before the new claim's Started).
WITH ended AS (
    DELETE FROM work
    WHERE work.process = sqlc.arg(process)::TEXT AND work.session_id = sqlc.arg(session_id)::UUID
      AND work.machine_id = ANY (sqlc.arg(machine_ids)::UUID[])
      AND work.claim_id = ANY (sqlc.arg(claim_ids)::UUID[])
    RETURNING work.machine_id, work.process, work.session_id, work.claim_id
), cleared AS (
    DELETE FROM work_backoff
    WHERE work_backoff.machine_id IN (SELECT ended.machine_id FROM ended)
      AND work_backoff.process = sqlc.arg(process)::TEXT
    RETURNING work_backoff.machine_id
)
INSERT INTO work_history (machine_id, process, session_id, event, at, component_name, claim_id)
SELECT ended.machine_id, ended.process, ended.session_id, 'Finished', statement_timestamp(),
       sqlc.arg(component_name)::TEXT, ended.claim_id
FROM ended
RETURNING work_history.claim_id;

-- name: WorkEndMany :many
-- WorkEndMany ends, with the given event (Canceled or Failed) and causes
-- (aligned with claim_ids; '' for none), the claims claim_ids of process
-- on machine_ids that the session still holds, and returns their claim
-- ids: those missing were no longer held (the fence of a batch's ends).
WITH ended AS (
    DELETE FROM work
    WHERE work.process = sqlc.arg(process)::TEXT AND work.session_id = sqlc.arg(session_id)::UUID
      AND work.machine_id = ANY (sqlc.arg(machine_ids)::UUID[])
      AND work.claim_id = ANY (sqlc.arg(claim_ids)::UUID[])
    RETURNING work.machine_id, work.process, work.session_id, work.claim_id
), causes AS (
    SELECT (sqlc.arg(claim_ids)::UUID[])[i] AS claim_id, (sqlc.arg(causes)::TEXT[])[i] AS cause
    FROM generate_series(1, array_length(sqlc.arg(claim_ids)::UUID[], 1)) AS i
)
INSERT INTO work_history (machine_id, process, session_id, event, at, failed_cause, component_name, claim_id)
SELECT ended.machine_id, ended.process, ended.session_id, sqlc.arg(event)::work_history_event,
       statement_timestamp(), NULLIF(causes.cause, ''), sqlc.arg(component_name)::TEXT, ended.claim_id
FROM ended JOIN causes ON causes.claim_id = ended.claim_id
RETURNING work_history.claim_id;
