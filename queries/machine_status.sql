-- name: MachineStatusList :many
-- MachineStatusList returns up to row_limit machines with their stage, in
-- machine_id order after after_id (keyset pagination: pass the last id of
-- the previous page, or the nil UUID), of one stage or (stage NULL) of all.
SELECT * FROM machine_status
WHERE machine_id > sqlc.arg(after_id)
  AND (sqlc.narg(stage)::TEXT IS NULL OR stage = sqlc.narg(stage)::TEXT)
ORDER BY machine_id
LIMIT sqlc.arg(row_limit);

-- name: MachineStatusGet :one
-- MachineStatusGet returns one machine with its stage.
SELECT * FROM machine_status WHERE machine_id = sqlc.arg(machine_id);

-- name: MachineStatusCounts :many
-- MachineStatusCounts counts machines per stage.
SELECT stage, count(*) AS machines FROM machine_status
GROUP BY stage ORDER BY stage;

-- name: MachineStatusFilter :many
-- MachineStatusFilter returns up to row_limit machines after after_id in
-- machine_id order (keyset pagination), optionally only those at stage, with
-- live work of working_process, or in backoff for backoff_process.
SELECT ms.* FROM machine_status ms
WHERE ms.machine_id > sqlc.arg(after_id)
  AND (sqlc.narg(stage)::TEXT IS NULL OR ms.stage = sqlc.narg(stage)::TEXT)
  AND (sqlc.narg(working_process)::TEXT IS NULL OR EXISTS (
        SELECT 1 FROM work w JOIN sessions s ON s.session_id = w.session_id
        WHERE w.machine_id = ms.machine_id AND w.process = sqlc.narg(working_process)::TEXT
          AND s.deadline > now()))
  AND (sqlc.narg(backoff_process)::TEXT IS NULL OR EXISTS (
        SELECT 1 FROM work_backoff b
        WHERE b.machine_id = ms.machine_id AND b.process = sqlc.narg(backoff_process)::TEXT
          AND b.until > now()))
ORDER BY ms.machine_id
LIMIT sqlc.arg(row_limit);

-- name: MachineTagsGet :one
-- MachineTagsGet returns the example pipeline's tags of one machine; a NULL
-- time means the tag is absent.
SELECT m.machine_id,
       p.provider, p.provided_at,
       a.agent_version, a.started_at AS agent_started_at,
       o.os_image, o.installed_at AS os_installed_at
FROM machines m
LEFT JOIN machine_provided p ON p.machine_id = m.machine_id
LEFT JOIN machine_agent_started a ON a.machine_id = m.machine_id
LEFT JOIN machine_os_installed o ON o.machine_id = m.machine_id
WHERE m.machine_id = sqlc.arg(machine_id);
