-- name: WorkBackoffDelete :execrows
-- WorkBackoffDelete clears the backoff of (machine, process).
DELETE FROM work_backoff
WHERE machine_id = sqlc.arg(machine_id) AND process = sqlc.arg(process);

-- name: WorkBackoffIntervals :many
-- WorkBackoffIntervals returns the interval last used for each of
-- machine_ids that has one for process, whether or not its backoff has
-- expired.
SELECT machine_id, interval_seconds FROM work_backoff
WHERE process = sqlc.arg(process)::TEXT AND machine_id = ANY (sqlc.arg(machine_ids)::UUID[]);

-- name: WorkBackoffUpsertMany :exec
-- WorkBackoffUpsertMany puts machine_ids in backoff for process: each until
-- wait_seconds from this statement's time (after the Failed rows of its
-- transaction), with its cause and the interval it grew to, arrays aligned
-- with machine_ids.
INSERT INTO work_backoff (machine_id, process, until, cause, interval_seconds)
SELECT (sqlc.arg(machine_ids)::UUID[])[i], sqlc.arg(process)::TEXT,
       statement_timestamp() + (sqlc.arg(wait_seconds)::FLOAT8[])[i] * INTERVAL '1 second',
       (sqlc.arg(causes)::TEXT[])[i], (sqlc.arg(interval_seconds)::FLOAT8[])[i]
FROM generate_series(1, array_length(sqlc.arg(machine_ids)::UUID[], 1)) AS i
ON CONFLICT (machine_id, process) DO UPDATE
SET until = excluded.until, cause = excluded.cause, interval_seconds = excluded.interval_seconds;
