-- 000017_history_order_and_scans: history in the order it happened, and
-- scans that do not grow with the fleet.
--   - work_history.seq: each (machine, process) pair's events numbered by
--     the pair's claim row (work_fencing.version), which every claim and
--     every end of the pair writes in the transaction that claims or ends:
--     an exact order, where at (dated by each gateway's clock on
--     CockroachDB, whose clocks differ by up to the maximum offset) is for
--     display. Rows written before this migration, or by older binaries,
--     have none and sort by at.
--   - work_history_pair_idx: a pair's history in that order.
--   - work_process_idx: the claims of one process (a cap change, the
--     process_status view, a worker's drain count) without a scan of every
--     process's claims.
--   - sessions_deadline_idx goes: every heartbeat moved its session's entry
--     (on CockroachDB leaving a deleted key behind for gc.ttlseconds), and
--     garbage collection now lists expired sessions from the primary index
--     (bmdb/gc.go), which nothing else needed it for.
--   - work_history_retention: how far history retention got (every row
--     older than pruned_before is gone), so that the next batch and the next
--     run start there rather than step over what was deleted.
--
-- Compatibility: additive for binaries from 000014 on (oldest_compatible
-- 14): they leave seq NULL, and their garbage collection reads the
-- sessions by deadline without the index (a scan of the sessions table).
--
-- bmdb:rerunnable (safe to run again from any partial state; see migrations.go)
ALTER TABLE work_history ADD COLUMN IF NOT EXISTS seq INT8;

CREATE INDEX IF NOT EXISTS work_history_pair_idx ON work_history (machine_id, process, seq);

CREATE INDEX IF NOT EXISTS work_process_idx ON work (process, session_id);

DROP INDEX IF EXISTS sessions_deadline_idx;

CREATE TABLE IF NOT EXISTS work_history_retention (
    singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    pruned_before TIMESTAMPTZ NOT NULL
);

-- readable_history, with each row's place in its pair's history.
CREATE OR REPLACE VIEW readable_history AS
SELECT h.id, h.machine_id, h.process, h.event::TEXT AS event, h.session_id,
       COALESCE(h.component_name, s.component_name, '') AS component_name,
       h.at, COALESCE(h.failed_cause, '') AS cause, h.seq
FROM work_history h LEFT JOIN sessions s ON s.session_id = h.session_id;

INSERT INTO bmdb_schema_compat (version, oldest_compatible) VALUES (17, 14)
ON CONFLICT (version) DO NOTHING;
