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
