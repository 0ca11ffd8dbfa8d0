-- 000016_control_delete: an operator deletes a process's controls row
-- (bmdb.Session.DeleteProcessControls; bmdbctl controls delete), to take
-- a process that no longer runs, or a mistyped one, off the fleet
-- controls. The deletion is recorded in process_control_history with the
-- new action 'delete', which the table's CHECK now allows. The CHECK was
-- made unnamed by 000015, so each engine named it its own way
-- (PostgreSQL: process_control_history_action_check; CockroachDB:
-- check_action): both names are dropped, and the new CHECK is added under
-- the first. Each statement is safe to run again, alone or after any of
-- the others, as CockroachDB runs them one at a time.
--
-- Compatibility: additive for every binary since 000014 (they never write
-- 'delete'; their process lists show it as any other action).
--
-- bmdb:rerunnable (safe to run again from any partial state; see migrations.go)
ALTER TABLE process_control_history DROP CONSTRAINT IF EXISTS check_action;
ALTER TABLE process_control_history DROP CONSTRAINT IF EXISTS process_control_history_action_check;
ALTER TABLE process_control_history ADD CONSTRAINT process_control_history_action_check
    CHECK (action IN ('pause', 'resume', 'cap', 'uncap', 'delete'));

INSERT INTO bmdb_schema_compat (version, oldest_compatible) VALUES (16, 14)
ON CONFLICT (version) DO NOTHING;
