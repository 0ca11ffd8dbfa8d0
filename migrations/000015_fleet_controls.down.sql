-- Reverts 000015_fleet_controls: pauses, caps and their history go.
DELETE FROM bmdb_schema_compat WHERE version = 15;
DROP VIEW IF EXISTS process_status;
DROP INDEX IF EXISTS work_slot_idx;
ALTER TABLE work DROP COLUMN IF EXISTS slot;
DROP TABLE IF EXISTS process_control_history;
DROP TABLE IF EXISTS process_slots;
DROP TABLE IF EXISTS process_controls;
