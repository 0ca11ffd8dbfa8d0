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
