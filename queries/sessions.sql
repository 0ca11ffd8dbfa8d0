-- name: SessionGet :one
-- SessionGet returns one session row, alive or not.
SELECT * FROM sessions WHERE session_id = sqlc.arg(session_id);

-- name: SessionExpiredList :many
-- SessionExpiredList returns up to row_limit sessions that have expired
-- and are not collected yet, most recently expired first: their claims are
-- stuck until a takeover or GC.
SELECT * FROM sessions WHERE deadline <= now()
ORDER BY deadline DESC, session_id
LIMIT sqlc.arg(row_limit);
