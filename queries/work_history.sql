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

-- name: WorkHistoryInsert :exec
-- WorkHistoryInsert records one event that is not part of a claim's life,
-- e.g. an operator's BackoffCleared.
INSERT INTO work_history (machine_id, process, session_id, event, failed_cause, component_name)
VALUES (sqlc.arg(machine_id), sqlc.arg(process), sqlc.arg(session_id),
        sqlc.arg(event), sqlc.narg(failed_cause), sqlc.arg(component_name));

-- name: WorkHistoryRecentEvents :many
-- WorkHistoryRecentEvents returns up to row_limit events of one kind for a
-- process since a time, newest first: an index range scan on
-- (process, event, at), e.g. the last hour of failures.
SELECT * FROM work_history
WHERE process = sqlc.arg(process) AND event = sqlc.arg(event) AND at >= sqlc.arg(since)
ORDER BY at DESC, id DESC
LIMIT sqlc.arg(row_limit);

-- name: WorkHistoryPrune :execrows
-- WorkHistoryPrune deletes up to batch_size of the oldest history rows older
-- than older_than_seconds on the database clock. Retention calls it until it
-- deletes nothing, one transaction per batch.
DELETE FROM work_history
WHERE id IN (
    SELECT h.id FROM work_history h
    WHERE h.at < now() - sqlc.arg(older_than_seconds)::FLOAT8 * INTERVAL '1 second'
    ORDER BY h.at
    LIMIT sqlc.arg(batch_size)
);
