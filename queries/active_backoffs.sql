-- name: ActiveBackoffsList :many
-- ActiveBackoffsList returns up to row_limit backoffs in force, soonest to
-- end first, of one process or (process NULL) of all.
SELECT * FROM active_backoffs
WHERE sqlc.narg(process)::TEXT IS NULL OR process = sqlc.narg(process)::TEXT
ORDER BY until, machine_id, process
LIMIT sqlc.arg(row_limit);

-- name: ActiveBackoffsForMachine :many
-- ActiveBackoffsForMachine returns a machine's backoffs in force.
SELECT * FROM active_backoffs WHERE machine_id = sqlc.arg(machine_id)
ORDER BY until, process;

-- name: ActiveBackoffCountsByProcess :many
-- ActiveBackoffCountsByProcess counts backoffs in force per process.
SELECT process, count(*) AS backoffs FROM active_backoffs
GROUP BY process ORDER BY process;

-- name: ActiveBackoffsForMachines :many
-- ActiveBackoffsForMachines returns the backoffs in force of the given
-- machines (a page of a machine list), by machine, soonest to end first.
SELECT * FROM active_backoffs WHERE machine_id = ANY (sqlc.arg(machine_ids)::UUID[])
ORDER BY machine_id, until, process;
