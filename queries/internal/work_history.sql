-- name: WorkHistoryInsert :exec
-- WorkHistoryInsert records one event that is not part of a claim's life,
-- e.g. an operator's BackoffCleared, placed in the pair's history after
-- its last claim or end (seq: the pair's claim row's version, not
-- incremented; none if the pair was never claimed).
INSERT INTO work_history (machine_id, process, session_id, event, failed_cause, component_name, seq)
VALUES (sqlc.arg(machine_id), sqlc.arg(process), sqlc.arg(session_id),
        sqlc.arg(event), sqlc.narg(failed_cause), sqlc.arg(component_name),
        (SELECT f.version FROM work_fencing f WHERE f.machine_id = sqlc.arg(machine_id) AND f.process = sqlc.arg(process)));

-- name: WorkHistoryPrunedBefore :one
-- WorkHistoryPrunedBefore returns how far retention got: every history row
-- dated before it is gone (no row: retention never ran).
SELECT pruned_before FROM work_history_retention WHERE singleton;

-- name: WorkHistoryPrune :one
-- WorkHistoryPrune deletes up to batch_size of the oldest history rows
-- dated from from_at on and older than older_than_seconds on the database
-- clock, oldest first, records in work_history_retention that every row
-- dated before the last one it deleted is gone, and returns how many it
-- deleted and that date (from_at if none). Retention calls it until it deletes fewer than
-- batch_size, one transaction per batch, each from where the last got
-- (from_at: WorkHistoryPrunedBefore's, then each batch's last_at), so that
-- no batch and no later run reads again what an earlier one deleted: on
-- CockroachDB a deleted entry of work_history_at_idx stays, and is stepped
-- over by every scan, for gc.ttlseconds.
WITH doomed AS (
    SELECT h.id, h.at FROM work_history h
    WHERE h.at >= sqlc.arg(from_at)::TIMESTAMPTZ
      AND h.at < statement_timestamp() - sqlc.arg(older_than_seconds)::FLOAT8 * INTERVAL '1 second'
    ORDER BY h.at, h.id
    LIMIT sqlc.arg(batch_size)
), gone AS (
    DELETE FROM work_history WHERE id IN (SELECT doomed.id FROM doomed)
    RETURNING id
), mark AS (
    INSERT INTO work_history_retention (singleton, pruned_before)
    SELECT TRUE, max(doomed.at) FROM doomed HAVING count(*) > 0
    ON CONFLICT (singleton) DO UPDATE
    SET pruned_before = GREATEST(work_history_retention.pruned_before, excluded.pruned_before)
    RETURNING pruned_before
)
SELECT (SELECT count(*) FROM gone)::INT8 AS deleted,
       COALESCE((SELECT max(doomed.at) FROM doomed), sqlc.arg(from_at)::TIMESTAMPTZ)::TIMESTAMPTZ AS last_at;
