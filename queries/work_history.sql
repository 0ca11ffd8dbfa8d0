-- name: WorkHistoryForMachine :many
-- WorkHistoryForMachine returns a machine's history, by process, each
-- process's in the order it happened: by seq, which every claim and end of
-- the (machine, process) pair numbers; at, dated by each gateway's clock
-- on CockroachDB (which may differ by up to the cluster's maximum offset),
-- orders only rows that have none (written before migration 000017).
SELECT * FROM work_history
WHERE machine_id = sqlc.arg(machine_id)
ORDER BY process, COALESCE(seq, 0), at, id;

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

-- name: WorkHistoryEventsPerMinute :many
-- WorkHistoryEventsPerMinute counts the Finished, Failed and Abandoned
-- events per process and minute since a time (pass at most an hour ago):
-- an index range scan on work_history (at), whatever the table's size.
SELECT process, event::TEXT AS event, date_trunc('minute', at)::TIMESTAMPTZ AS minute, count(*) AS events
FROM work_history
WHERE at >= sqlc.arg(since) AND event IN ('Finished', 'Failed', 'Abandoned')
GROUP BY 1, 2, 3 ORDER BY 3, 1, 2
LIMIT sqlc.arg(row_limit);

-- name: WorkHistoryRecentComponents :many
-- WorkHistoryRecentComponents returns the components that started the last
-- row_limit claims of a process: an index range scan on (process, event,
-- at), whatever the table's size.
SELECT DISTINCT r.component_name::TEXT AS component_name FROM (
    SELECT COALESCE(h.component_name, s.component_name, '') AS component_name
    FROM work_history h LEFT JOIN sessions s ON s.session_id = h.session_id
    WHERE h.process = sqlc.arg(process) AND h.event = 'Started'
    ORDER BY h.at DESC
    LIMIT sqlc.arg(row_limit)
) r
ORDER BY 1;

-- name: WorkHistoryEventCountsForMachines :many
-- WorkHistoryEventCountsForMachines counts the history events of one
-- process per machine and event, for the given machines (those without
-- any event of the process have no row): an index range scan on
-- work_history (machine_id, at) per machine.
SELECT machine_id, event, count(*) AS events FROM work_history
WHERE process = sqlc.arg(process) AND machine_id = ANY (sqlc.arg(machine_ids)::UUID[])
GROUP BY machine_id, event
ORDER BY machine_id, event;
