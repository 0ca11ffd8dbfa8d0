-- name: CurrentWorkList :many
-- CurrentWorkList returns up to row_limit claims, oldest first, of one
-- process or (process NULL) of all.
SELECT * FROM current_work
WHERE sqlc.narg(process)::TEXT IS NULL OR process = sqlc.narg(process)::TEXT
ORDER BY started_at, machine_id, process
LIMIT sqlc.arg(row_limit);

-- name: CurrentWorkForMachine :many
-- CurrentWorkForMachine returns a machine's claims.
SELECT * FROM current_work WHERE machine_id = sqlc.arg(machine_id)
ORDER BY started_at, process;

-- name: CurrentWorkForSession :many
-- CurrentWorkForSession returns a session's claims.
SELECT * FROM current_work WHERE session_id = sqlc.arg(session_id)
ORDER BY started_at, machine_id, process;

-- name: CurrentWorkCountsByProcess :many
-- CurrentWorkCountsByProcess counts live claims per process.
SELECT process, count(*) AS claims FROM current_work WHERE alive
GROUP BY process ORDER BY process;

-- name: CurrentWorkHealthByProcess :many
-- CurrentWorkHealthByProcess returns per process its live claims and its
-- claims held by expired sessions (stuck until a takeover or GC), each with
-- the age of its oldest claim (0 when there is none).
SELECT process,
       count(*) FILTER (WHERE alive) AS live_claims,
       COALESCE(max(age_seconds) FILTER (WHERE alive), 0)::FLOAT8 AS oldest_live_age_seconds,
       count(*) FILTER (WHERE NOT alive) AS expired_claims,
       COALESCE(max(age_seconds) FILTER (WHERE NOT alive), 0)::FLOAT8 AS oldest_expired_age_seconds
FROM current_work
GROUP BY process ORDER BY process;

-- name: CurrentWorkExpiredList :many
-- CurrentWorkExpiredList returns up to row_limit claims held by expired
-- sessions, oldest first: the work that is stuck until the next takeover
-- or GC.
SELECT * FROM current_work WHERE NOT alive
ORDER BY started_at, machine_id, process
LIMIT sqlc.arg(row_limit);

-- name: CurrentWorkForMachines :many
-- CurrentWorkForMachines returns the claims of the given machines (a page
-- of a machine list), by machine, oldest first.
SELECT * FROM current_work WHERE machine_id = ANY (sqlc.arg(machine_ids)::UUID[])
ORDER BY machine_id, started_at, process;

-- name: CurrentWorkComponentsByProcess :many
-- CurrentWorkComponentsByProcess returns the components that hold claims of
-- each process, alive or not.
SELECT DISTINCT process, component_name FROM current_work
ORDER BY process, component_name;

-- name: CurrentWorkAgeHistogram :many
-- CurrentWorkAgeHistogram counts claims by age bucket (0: under 10 s, 1:
-- under 30 s, 2: under 1 m, 3: under 5 m, 4: under 15 m, 5: under 1 h, 6:
-- under 6 h, 7: older) and by whether their session is alive.
SELECT (CASE WHEN age_seconds < 10 THEN 0 WHEN age_seconds < 30 THEN 1
             WHEN age_seconds < 60 THEN 2 WHEN age_seconds < 300 THEN 3
             WHEN age_seconds < 900 THEN 4 WHEN age_seconds < 3600 THEN 5
             WHEN age_seconds < 21600 THEN 6 ELSE 7 END)::INT8 AS bucket,
       alive, count(*) AS claims
FROM current_work
GROUP BY 1, 2 ORDER BY 1, 2;

-- name: CurrentWorkMachinesByAge :many
-- CurrentWorkMachinesByAge returns up to row_limit claimed machines, those
-- with claims of process or (process NULL) of any, by the start of their
-- oldest such claim, oldest first, after the cursor (after_at, after_id):
-- keyset pagination; start with a cursor before any claim.
SELECT mo.machine_id, mo.machine_created_at, mo.live_claims, mo.expired_claims, mo.active_backoffs,
       c.oldest::TIMESTAMPTZ AS oldest_claim
FROM (SELECT w.machine_id, min(w.started_at) AS oldest FROM work w
      WHERE sqlc.narg(process)::TEXT IS NULL OR w.process = sqlc.narg(process)::TEXT
      GROUP BY w.machine_id) c
JOIN machine_overview mo ON mo.machine_id = c.machine_id
WHERE (c.oldest, c.machine_id) > (sqlc.arg(after_at)::TIMESTAMPTZ, sqlc.arg(after_id)::UUID)
ORDER BY c.oldest, c.machine_id
LIMIT sqlc.arg(row_limit);

-- name: CurrentWorkLeftForProcess :one
-- CurrentWorkLeftForProcess counts what of one process the session
-- session_id cannot claim now: the machines in backoff for it, and its
-- claims held by other sessions (alive, or expired and not yet taken
-- over). worker's StopWhenIdle reads it to tell a loop that has nothing
-- left from one that has nothing it can do yet.
SELECT (SELECT count(*) FROM active_backoffs b WHERE b.process = sqlc.arg(process)::TEXT) AS in_backoff,
       (SELECT count(*) FROM current_work w
        WHERE w.process = sqlc.arg(process)::TEXT AND w.session_id <> sqlc.arg(session_id)) AS claimed_by_others;
