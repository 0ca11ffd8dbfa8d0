-- name: WorkHistoryInsert :exec
-- WorkHistoryInsert records one event that is not part of a claim's life,
-- e.g. an operator's BackoffCleared.
INSERT INTO work_history (machine_id, process, session_id, event, failed_cause, component_name)
VALUES (sqlc.arg(machine_id), sqlc.arg(process), sqlc.arg(session_id),
        sqlc.arg(event), sqlc.narg(failed_cause), sqlc.arg(component_name));

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
