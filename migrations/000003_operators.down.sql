-- Reverts 000003_operators. The BackoffCleared enum value stays (neither
-- engine drops enum values portably); binaries of 000002 read it as any
-- other event string, and re-applying 000003 keeps it.
DROP VIEW IF EXISTS machine_status;
DROP VIEW IF EXISTS readable_history;
DROP VIEW IF EXISTS active_backoffs;
DROP VIEW IF EXISTS current_work;
DROP VIEW IF EXISTS live_sessions;
DROP INDEX IF EXISTS work_history_at_idx;
ALTER TABLE work_history DROP COLUMN IF EXISTS component_name;
