-- name: ProcessStatusAll :many
-- ProcessStatusAll returns every process with controls (every process that
-- claimed, or that an operator paused or capped): paused or not, its cap
-- (NULL: none), the last change, and its live claims; by name.
SELECT * FROM process_status ORDER BY process;

-- name: ProcessControlHistory :many
-- ProcessControlHistory returns the pauses, resumes and cap changes of
-- process ('' for every process), newest first, at most limit of them.
SELECT id, process, action, claim_cap, at, actor, runtime_info, reason
FROM process_control_history
WHERE sqlc.arg(process)::TEXT = '' OR process = sqlc.arg(process)::TEXT
ORDER BY at DESC, id DESC
LIMIT sqlc.arg(max_rows);

-- name: ProcessStatusGet :one
-- ProcessStatusGet returns the controls and live claims of process, as
-- ProcessStatusAll does; no row if it has no controls.
SELECT * FROM process_status WHERE process = sqlc.arg(process);
