-- Reverts 000016_control_delete: the records of deleted controls go, and
-- the CHECK allows pause, resume, cap and uncap again.
DELETE FROM bmdb_schema_compat WHERE version = 16;
DELETE FROM process_control_history WHERE action = 'delete';
ALTER TABLE process_control_history DROP CONSTRAINT IF EXISTS process_control_history_action_check;
ALTER TABLE process_control_history ADD CONSTRAINT process_control_history_action_check
    CHECK (action IN ('pause', 'resume', 'cap', 'uncap'));
