-- name: WorkBackoffForMachine :many
-- WorkBackoffForMachine returns every backoff row of a machine, in force or
-- expired (whose interval the next failure grows from).
SELECT machine_id, process, until, cause, interval_seconds, (until > now())::BOOL AS active
FROM work_backoff WHERE machine_id = sqlc.arg(machine_id)
ORDER BY process;
