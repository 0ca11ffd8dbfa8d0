-- name: ReadableHistoryForMachine :many
-- ReadableHistoryForMachine returns up to row_limit of a machine's most
-- recent events since a time (NULL: all), of one process or (NULL) of all:
-- the newest by at, an index range scan on work_history (machine_id, ...),
-- ordered by process and, within a process, newest first in the order
-- they happened (seq, numbered by the pair's claims and ends: at is each
-- gateway's clock on CockroachDB, where clocks may differ by up to the
-- cluster's maximum offset).
SELECT r.* FROM (
    SELECT * FROM readable_history
    WHERE machine_id = sqlc.arg(machine_id)
      AND (sqlc.narg(process)::TEXT IS NULL OR process = sqlc.narg(process)::TEXT)
      AND (sqlc.narg(since)::TIMESTAMPTZ IS NULL OR at >= sqlc.narg(since)::TIMESTAMPTZ)
    ORDER BY at DESC, id DESC
    LIMIT sqlc.arg(row_limit)
) r
ORDER BY r.process, COALESCE(r.seq, 0) DESC, r.at DESC, r.id DESC;

-- name: ReadableHistoryForSession :many
-- ReadableHistoryForSession returns up to row_limit of a session's most
-- recent events, newest first.
SELECT * FROM readable_history
WHERE session_id = sqlc.arg(session_id)
ORDER BY at DESC, id DESC
LIMIT sqlc.arg(row_limit);

-- name: ReadableHistoryForMachinePage :many
-- ReadableHistoryForMachinePage returns up to row_limit of a machine's
-- events after the cursor, by process, and within a process newest first
-- in the order they happened: by seq (numbered by the pair's claims and
-- ends), then at and id (rows written before migration 000017 have no
-- seq). The cursor is the last row of the previous page: its process
-- (after_process), seq (0 for none), at and id; start with an empty
-- process. Keyset pagination that no clock can reorder.
SELECT * FROM readable_history
WHERE machine_id = sqlc.arg(machine_id)
  AND (process > sqlc.arg(after_process)::TEXT
       OR (process = sqlc.arg(after_process)::TEXT
           AND (COALESCE(seq, 0), at, id) < (sqlc.arg(before_seq)::INT8, sqlc.arg(before_at)::TIMESTAMPTZ, sqlc.arg(before_id)::INT8)))
ORDER BY process, COALESCE(seq, 0) DESC, at DESC, id DESC
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
