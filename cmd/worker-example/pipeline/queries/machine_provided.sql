-- name: MachineProvidedInsert :exec
-- MachineProvidedInsert tags a machine as provided (the example's first
-- stage). Fails with a unique violation if it already is.
INSERT INTO machine_provided (machine_id, provider) VALUES (sqlc.arg(machine_id), sqlc.arg(provider));

-- name: MachinesNeedingProvide :many
-- MachinesNeedingProvide returns up to row_limit machines, oldest first, that
-- are not provided, have no live claim of "provide", and are not in backoff
-- for it. Claims of expired sessions do not exclude a machine: Work takes
-- them over.
SELECT m.machine_id FROM machines m
WHERE NOT EXISTS (SELECT 1 FROM machine_provided t WHERE t.machine_id = m.machine_id)
  AND NOT EXISTS (
        SELECT 1 FROM work w JOIN sessions s ON s.session_id = w.session_id
        WHERE w.machine_id = m.machine_id AND w.process = 'provide' AND s.deadline > now()
    )
  AND NOT EXISTS (
        SELECT 1 FROM work_backoff b
        WHERE b.machine_id = m.machine_id AND b.process = 'provide' AND b.until > now()
    )
ORDER BY m.machine_created_at, m.machine_id
LIMIT sqlc.arg(row_limit);
