-- name: MachineRackedInsert :exec
-- MachineRackedInsert records that a machine was racked (the seeding step).
INSERT INTO machine_racked (machine_id, rack) VALUES (sqlc.arg(machine_id), sqlc.arg(rack));
