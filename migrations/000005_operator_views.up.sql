-- 000005_operator_views: what operators need to see the fleet in plain
-- SQL: read-only views, an index for retention and recent events, and one
-- for a session's history.
--
-- Compatibility: additive (views and indexes). Nothing older binaries read
-- or write changed. (It also created machine_status, a view of the example
-- pipeline's stages; 000012 replaced it with the generic machine_overview,
-- and a new database never has it.)
--
-- bmdb:rerunnable (safe to run again from any partial state; see migrations.go)

-- Retention (bmdb.PruneHistory) deletes the oldest rows in batches.
CREATE INDEX IF NOT EXISTS work_history_at_idx ON work_history (at);

-- The web page of a session lists its history.
CREATE INDEX IF NOT EXISTS work_history_session_idx ON work_history (session_id, at);

-- live_sessions: sessions alive on the database clock.
CREATE OR REPLACE VIEW live_sessions AS
SELECT s.session_id, s.component_name, s.runtime_info, s.created_at, s.deadline,
       s.interval_seconds,
       EXTRACT(EPOCH FROM s.deadline - now())::FLOAT8 AS seconds_left
FROM sessions s
WHERE s.deadline > now();

-- current_work: every claim with its holder and age; alive is false for a
-- claim of an expired session, which the next Work takes over.
CREATE OR REPLACE VIEW current_work AS
SELECT w.machine_id, w.process, w.session_id, s.component_name, w.started_at,
       EXTRACT(EPOCH FROM now() - w.started_at)::FLOAT8 AS age_seconds,
       (s.deadline > now()) AS alive
FROM work w JOIN sessions s ON s.session_id = w.session_id;

-- active_backoffs: (machine, process) pairs kept from being claimed now.
CREATE OR REPLACE VIEW active_backoffs AS
SELECT b.machine_id, b.process, b.cause, b.until, b.interval_seconds,
       EXTRACT(EPOCH FROM b.until - now())::FLOAT8 AS seconds_left
FROM work_backoff b
WHERE b.until > now();

-- readable_history: work_history with the component of each step.
CREATE OR REPLACE VIEW readable_history AS
SELECT h.id, h.machine_id, h.process, h.event::TEXT AS event, h.session_id,
       COALESCE(h.component_name, s.component_name, '') AS component_name,
       h.at, COALESCE(h.failed_cause, '') AS cause
FROM work_history h LEFT JOIN sessions s ON s.session_id = h.session_id;
