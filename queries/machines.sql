-- name: MachinesWithoutWork :many
-- MachinesWithoutWork returns up to row_limit machines, oldest first, that
-- have no claim of process and are not in backoff for it. It suits
-- applications whose only condition is "not being worked on"; most join their
-- tag tables instead.
SELECT m.machine_id FROM machines m
WHERE NOT EXISTS (
        SELECT 1 FROM work w
        WHERE w.machine_id = m.machine_id AND w.process = sqlc.arg(process)
    )
  AND NOT EXISTS (
        SELECT 1 FROM work_backoff b
        WHERE b.machine_id = m.machine_id AND b.process = sqlc.arg(process)
          AND b.until > now()
    )
ORDER BY m.machine_created_at, m.machine_id
LIMIT sqlc.arg(row_limit);
