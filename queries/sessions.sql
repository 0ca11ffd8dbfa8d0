-- name: SessionStart :one
-- SessionStart inserts a new session whose deadline is one interval from now
-- on the database clock, and returns its id.
INSERT INTO sessions (component_name, runtime_info, interval_seconds, deadline)
VALUES (
    sqlc.arg(component_name),
    sqlc.arg(runtime_info),
    sqlc.arg(interval_seconds)::FLOAT8,
    now() + sqlc.arg(interval_seconds)::FLOAT8 * INTERVAL '1 second'
)
RETURNING session_id;

-- name: SessionPoke :execrows
-- SessionPoke extends a live session's deadline by its interval. It affects
-- no row when the session has expired or is gone: an expired session is never
-- resurrected.
UPDATE sessions
SET deadline = now() + interval_seconds * INTERVAL '1 second'
WHERE session_id = sqlc.arg(session_id) AND deadline > now();

-- name: SessionCheck :one
-- SessionCheck returns the session's id if it is alive on the database clock,
-- and no row otherwise. Every bmdb transaction runs it first.
SELECT session_id FROM sessions
WHERE session_id = sqlc.arg(session_id) AND deadline > now();

-- name: SessionGet :one
-- SessionGet returns one session row, alive or not.
SELECT * FROM sessions WHERE session_id = sqlc.arg(session_id);

-- name: SessionDelete :execrows
-- SessionDelete removes a session row; its work rows go with it (cascade).
-- Callers record their history first.
DELETE FROM sessions WHERE session_id = sqlc.arg(session_id);

-- name: SessionDeleteExpired :execrows
-- SessionDeleteExpired removes every session whose deadline passed more than
-- grace_seconds ago. Callers first record Abandoned history for their work
-- (WorkAbandonExpired).
DELETE FROM sessions
WHERE deadline < now() - sqlc.arg(grace_seconds)::FLOAT8 * INTERVAL '1 second';
