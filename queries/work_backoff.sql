-- name: WorkBackoffForMachine :many
-- WorkBackoffForMachine returns every backoff row of a machine, in force or
-- expired (whose interval the next failure grows from).
SELECT machine_id, process, until, cause, interval_seconds, (until > now())::BOOL AS active
FROM work_backoff WHERE machine_id = sqlc.arg(machine_id)
ORDER BY process;

-- name: WorkBackoffWaitingByProcess :many
-- WorkBackoffWaitingByProcess counts per process the machines with a backoff
-- row and no claim of that process: in_force still wait for their backoff
-- to end, due are past it and wait for a worker to retry them.
SELECT b.process,
       count(*) FILTER (WHERE b.until > now()) AS in_force,
       count(*) FILTER (WHERE b.until <= now()) AS due
FROM work_backoff b
WHERE NOT EXISTS (SELECT 1 FROM work w WHERE w.machine_id = b.machine_id AND w.process = b.process)
GROUP BY b.process ORDER BY b.process;
