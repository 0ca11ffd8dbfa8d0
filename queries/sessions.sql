-- name: SessionGet :one
-- SessionGet returns one session row, alive or not.
SELECT * FROM sessions WHERE session_id = sqlc.arg(session_id);
