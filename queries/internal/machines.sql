-- name: MachineCreateMany :many
-- MachineCreateMany inserts count new machines and returns their ids
-- (Tx.CreateMachines).
INSERT INTO machines (machine_id)
SELECT gen_random_uuid() FROM generate_series(1, sqlc.arg(count)::INT8)
RETURNING machine_id;
