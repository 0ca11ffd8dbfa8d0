-- name: ReadableHistoryForMachine :many
-- ReadableHistoryForMachine returns up to row_limit of a machine's most
-- recent events since a time (NULL: all), of one process or (NULL) of all,
-- newest first: an index range scan on work_history (machine_id, ...).
-- One process's events come in the order they happened (seq, numbered by
-- the pair's claims and ends); across processes, by at, which on
-- CockroachDB each gateway dates by its own clock (they may differ by up
-- to the cluster's maximum offset).
SELECT * FROM readable_history
WHERE machine_id = sqlc.arg(machine_id)
  AND (sqlc.narg(process)::TEXT IS NULL OR process = sqlc.narg(process)::TEXT)
  AND (sqlc.narg(since)::TIMESTAMPTZ IS NULL OR at >= sqlc.narg(since)::TIMESTAMPTZ)
ORDER BY (CASE WHEN sqlc.narg(process)::TEXT IS NULL THEN 0 ELSE COALESCE(seq, 0) END) DESC, at DESC, id DESC
LIMIT sqlc.arg(row_limit);

-- name: ReadableHistoryForSession :many
-- ReadableHistoryForSession returns up to row_limit of a session's most
-- recent events, newest first.
SELECT * FROM readable_history
WHERE session_id = sqlc.arg(session_id)
ORDER BY at DESC, id DESC
LIMIT sqlc.arg(row_limit);

-- name: ReadableHistoryForMachinePage :many
-- ReadableHistoryForMachinePage returns up to row_limit of a machine's
-- events older than the cursor (before_at, before_id), newest first: keyset
-- pagination on work_history (machine_id, at). Start with a cursor in the
-- future.
SELECT * FROM readable_history
WHERE machine_id = sqlc.arg(machine_id)
  AND (at, id) < (sqlc.arg(before_at)::TIMESTAMPTZ, sqlc.arg(before_id)::INT8)
ORDER BY at DESC, id DESC
LIMIT sqlc.arg(row_limit);

-- name: ReadableHistoryRecentFailures :many
-- ReadableHistoryRecentFailures returns up to row_limit Failed events since
-- a time, newest first.
SELECT * FROM readable_history
WHERE event = 'Failed' AND at >= sqlc.arg(since)
ORDER BY at DESC, id DESC
LIMIT sqlc.arg(row_limit);

-- name: ReadableHistoryRecent :many
-- ReadableHistoryRecent returns up to row_limit of the fleet's most recent
-- events since a time (NULL: all), of one process or (NULL) of all, newest
-- first: a backward scan of work_history (at).
SELECT * FROM readable_history
WHERE (sqlc.narg(process)::TEXT IS NULL OR process = sqlc.narg(process)::TEXT)
  AND (sqlc.narg(since)::TIMESTAMPTZ IS NULL OR at >= sqlc.narg(since)::TIMESTAMPTZ)
ORDER BY at DESC, id DESC
LIMIT sqlc.arg(row_limit);
