-- Reverts 000005_operator_views.
DROP VIEW IF EXISTS machine_status;
DROP VIEW IF EXISTS readable_history;
DROP VIEW IF EXISTS active_backoffs;
DROP VIEW IF EXISTS current_work;
DROP VIEW IF EXISTS live_sessions;
DROP INDEX IF EXISTS work_history_session_idx;
DROP INDEX IF EXISTS work_history_at_idx;
