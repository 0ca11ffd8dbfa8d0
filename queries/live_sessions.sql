-- name: LiveSessionsList :many
-- LiveSessionsList returns the sessions alive on the database clock, by
-- component, oldest first.
SELECT * FROM live_sessions
ORDER BY component_name, created_at, session_id;
