-- name: MachinesWithoutWork :many
-- MachinesWithoutWork returns up to row_limit machines, oldest first, that
-- have no live claim of process and are not in backoff for it. A claim of
-- an expired session counts as none: the claim that gets such a machine
-- takes the dead session's claims over, so a dead worker's machines are
-- worked again at once. It suits applications whose only condition is
-- "not being worked on"; most join their tag tables instead, the same way.
SELECT m.machine_id FROM machines m
WHERE NOT EXISTS (
        SELECT 1 FROM work w JOIN sessions s ON s.session_id = w.session_id
        WHERE w.machine_id = m.machine_id AND w.process = sqlc.arg(process)
          AND s.deadline > now()
    )
  AND NOT EXISTS (
        SELECT 1 FROM work_backoff b
        WHERE b.machine_id = m.machine_id AND b.process = sqlc.arg(process)
          AND b.until > now()
    )
ORDER BY m.machine_created_at, m.machine_id
LIMIT sqlc.arg(row_limit);
