-- name: WorkHistoryForMachine :many
-- WorkHistoryForMachine returns a machine's history, oldest first.
SELECT * FROM work_history
WHERE machine_id = sqlc.arg(machine_id)
ORDER BY at, id;

-- name: WorkHistoryForProcessSince :many
-- WorkHistoryForProcessSince returns a process's events since a time, oldest
-- first.
SELECT * FROM work_history
WHERE process = sqlc.arg(process) AND at >= sqlc.arg(since)
ORDER BY at, id;

-- name: WorkHistorySummary :many
-- WorkHistorySummary counts history events per process and event.
SELECT process, event, count(*) AS events FROM work_history
GROUP BY process, event
ORDER BY process, event;
