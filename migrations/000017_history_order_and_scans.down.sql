-- Reverts 000017_history_order_and_scans.
DELETE FROM bmdb_schema_compat WHERE version = 17;
DROP VIEW IF EXISTS readable_history;
CREATE VIEW readable_history AS
SELECT h.id, h.machine_id, h.process, h.event::TEXT AS event, h.session_id,
       COALESCE(h.component_name, s.component_name, '') AS component_name,
       h.at, COALESCE(h.failed_cause, '') AS cause
FROM work_history h LEFT JOIN sessions s ON s.session_id = h.session_id;
DROP TABLE IF EXISTS work_history_retention;
CREATE INDEX IF NOT EXISTS sessions_deadline_idx ON sessions (deadline);
DROP INDEX IF EXISTS work_process_idx;
DROP INDEX IF EXISTS work_history_pair_idx;
ALTER TABLE work_history DROP COLUMN IF EXISTS seq;
