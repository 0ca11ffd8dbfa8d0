-- name: WorkHistoryForMachine :many
-- WorkHistoryForMachine returns a machine's history, oldest first.
SELECT * FROM work_history
WHERE machine_id = sqlc.arg(machine_id)
ORDER BY at, id;

-- name: WorkHistorySummary :many
-- WorkHistorySummary counts history events per process and event.
SELECT process, event, count(*) AS events FROM work_history
GROUP BY process, event
ORDER BY process, event;

-- name: WorkHistoryRecentEvents :many
-- WorkHistoryRecentEvents returns up to row_limit events of one kind for a
-- process since a time, newest first: an index range scan on
-- (process, event, at), e.g. the last hour of failures.
SELECT * FROM work_history
WHERE process = sqlc.arg(process) AND event = sqlc.arg(event) AND at >= sqlc.arg(since)
ORDER BY at DESC, id DESC
LIMIT sqlc.arg(row_limit);
