-- name: MachinesRackedInsert :exec
-- MachinesRackedInsert records that machines were racked in one rack (the
-- seeding step), in one statement whatever their number.
INSERT INTO machine_racked (machine_id, rack)
SELECT unnest(sqlc.arg(machine_ids)::UUID[]), sqlc.arg(rack)::TEXT;
