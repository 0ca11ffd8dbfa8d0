-- 000015_fleet_controls: operators pause a process and cap how many
-- machines it works on at once, fleet-wide, and the claim statement
-- enforces both (see "Fleet controls" in bmdb's package doc):
--   - process_controls: one row per process, made before the process's
--     first claim (by the claiming session, or by an operator's pause or
--     cap); every claim reads it, locked FOR SHARE, so that a pause or a
--     cap commits only after the claims in flight and every claim that
--     read it before the change fails (PostgreSQL's first committer wins)
--     or, on CockroachDB, is serialized before it;
--   - process_slots: slot numbers 0..cap-1 of a capped process, which a
--     claim locks FOR UPDATE SKIP LOCKED so that concurrent claims take
--     different free slots without waiting for each other;
--   - work.slot: the slot a claim of a capped process holds, unique per
--     process among live claims (work_slot_idx): no more live claims than
--     slots below the cap, whatever races; a claim that ends, or is
--     Abandoned, frees its slot with its row;
--   - process_control_history: every pause, resume and cap change, with
--     who made it, when and why;
--   - process_status: each process with its controls and live claims.
--
-- Compatibility: additive. Binaries before 000015 work beside it but do
-- not honor pauses and caps: upgrade every component before relying on
-- them.
--
-- bmdb:rerunnable (safe to run again from any partial state; see migrations.go)
CREATE TABLE IF NOT EXISTS process_controls (
    process TEXT PRIMARY KEY CHECK (length(process) BETWEEN 1 AND 128),
    paused BOOLEAN NOT NULL DEFAULT FALSE,
    claim_cap INT8 CHECK (claim_cap BETWEEN 1 AND 10000),
    changed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    changed_by TEXT NOT NULL DEFAULT '',
    reason TEXT NOT NULL DEFAULT ''
);

CREATE TABLE IF NOT EXISTS process_slots (
    process TEXT NOT NULL,
    slot INT8 NOT NULL CHECK (slot >= 0),
    PRIMARY KEY (process, slot)
);

CREATE TABLE IF NOT EXISTS process_control_history (
    id BIGSERIAL PRIMARY KEY,
    process TEXT NOT NULL,
    action TEXT NOT NULL CHECK (action IN ('pause', 'resume', 'cap', 'uncap')),
    claim_cap INT8,
    at TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor TEXT NOT NULL,
    runtime_info TEXT NOT NULL DEFAULT '',
    reason TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS process_control_history_process_idx ON process_control_history (process, at);

ALTER TABLE work ADD COLUMN IF NOT EXISTS slot INT8;
CREATE UNIQUE INDEX IF NOT EXISTS work_slot_idx ON work (process, slot) WHERE slot IS NOT NULL;

-- process_status: every process with controls (every process that
-- claimed since this migration, and every one an operator paused or
-- capped), with its live claims.
CREATE OR REPLACE VIEW process_status AS
SELECT c.process, c.paused, c.claim_cap, c.changed_at, c.changed_by, c.reason,
       (SELECT count(*) FROM work w JOIN sessions s ON s.session_id = w.session_id
        WHERE w.process = c.process AND s.deadline > now()) AS live_claims
FROM process_controls c;

INSERT INTO bmdb_schema_compat (version, oldest_compatible) VALUES (15, 14)
ON CONFLICT (version) DO NOTHING;
