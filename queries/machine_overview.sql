-- name: MachineOverviewGet :one
-- MachineOverviewGet returns one machine with its claim and backoff counts.
SELECT * FROM machine_overview WHERE machine_id = sqlc.arg(machine_id);

-- name: MachineOverviewFilter :many
-- MachineOverviewFilter returns up to row_limit machines after after_id in
-- machine_id order (keyset pagination: pass the last id of the previous
-- page, or the nil UUID), optionally only those with a claim of
-- working_process (live, or held by an expired session when
-- include_expired), or in backoff for backoff_process.
SELECT mo.* FROM machine_overview mo
WHERE mo.machine_id > sqlc.arg(after_id)
  AND (sqlc.narg(working_process)::TEXT IS NULL OR EXISTS (
        SELECT 1 FROM work w JOIN sessions s ON s.session_id = w.session_id
        WHERE w.machine_id = mo.machine_id AND w.process = sqlc.narg(working_process)::TEXT
          AND (s.deadline > now() OR sqlc.arg(include_expired)::BOOL)))
  AND (sqlc.narg(backoff_process)::TEXT IS NULL OR EXISTS (
        SELECT 1 FROM work_backoff b
        WHERE b.machine_id = mo.machine_id AND b.process = sqlc.narg(backoff_process)::TEXT
          AND b.until > now()))
ORDER BY mo.machine_id
LIMIT sqlc.arg(row_limit);

-- name: MachineCount :one
-- MachineCount counts the machines.
SELECT count(*) AS machines FROM machines;
