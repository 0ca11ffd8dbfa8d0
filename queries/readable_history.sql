-- name: ReadableHistoryForMachine :many
-- ReadableHistoryForMachine returns up to row_limit of a machine's most
-- recent events since a time (NULL: all), of one process or (NULL) of all,
-- newest first: an index range scan on work_history (machine_id, at).
SELECT * FROM readable_history
WHERE machine_id = sqlc.arg(machine_id)
  AND (sqlc.narg(process)::TEXT IS NULL OR process = sqlc.narg(process)::TEXT)
  AND (sqlc.narg(since)::TIMESTAMPTZ IS NULL OR at >= sqlc.narg(since)::TIMESTAMPTZ)
ORDER BY at DESC, id DESC
LIMIT sqlc.arg(row_limit);

-- name: ReadableHistoryForSession :many
-- ReadableHistoryForSession returns up to row_limit of a session's most
-- recent events, newest first.
SELECT * FROM readable_history
WHERE session_id = sqlc.arg(session_id)
ORDER BY at DESC, id DESC
LIMIT sqlc.arg(row_limit);
