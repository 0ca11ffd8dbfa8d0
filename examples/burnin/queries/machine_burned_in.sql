-- name: MachinesNeedingBurnIn :many
-- MachinesNeedingBurnIn returns racked machines without a burn-in, and
-- without a live claim of the burn-in process, oldest racked first (the
-- retrieval of the burn-in worker; bmdb itself skips machines in backoff).
SELECT r.machine_id FROM machine_racked r
WHERE NOT EXISTS (SELECT 1 FROM machine_burned_in b WHERE b.machine_id = r.machine_id)
  AND NOT EXISTS (SELECT 1 FROM work w JOIN sessions s ON s.session_id = w.session_id
                  WHERE w.machine_id = r.machine_id AND w.process = sqlc.arg(process)::TEXT
                    AND s.deadline > now())
ORDER BY r.racked_at, r.machine_id
LIMIT sqlc.arg(row_limit);

-- name: MachineBurnedInInsert :exec
-- MachineBurnedInInsert records a passed burn-in (the burn-in worker's
-- commit, in the transaction that ends the claim). A second insert for the
-- same machine fails: each machine is burned in exactly once.
INSERT INTO machine_burned_in (machine_id, burn_in_minutes) VALUES (sqlc.arg(machine_id), sqlc.arg(burn_in_minutes));

-- name: MachinesBurnedInCount :one
-- MachinesBurnedInCount counts the machines burned in.
SELECT count(*) FROM machine_burned_in;
