-- 000014_claims_overlap: batch transactions that overlap. The claim gate
-- (000013) goes: on PostgreSQL bmdb's batch transactions (claims and ends)
-- now run at snapshot isolation and keep their guarantees through one row
-- per (machine, process), work_fencing's:
--   - every claim and every end of the pair (Finished, Failed, Canceled,
--     Abandoned) writes it, in the transaction that claims or ends, and
--     version counts those writes; so under snapshot isolation (first
--     committer wins) a claim commits only if no claim or end of the pair
--     committed after its snapshot;
--   - a claim locks it FOR UPDATE SKIP LOCKED, instead of the machine's
--     row, which retrievals, foreign keys and operators read (on
--     CockroachDB an exclusive lock also blocks plain reads);
--   - it is created before the pair's first claim, outside any claim
--     transaction, with token 0 (no claim yet), so token may now be 0;
--   - claimed says whether the pair has a live claim (see below).
-- See "Isolation" in bmdb's package doc.
--
-- Compatibility: breaking for binaries before 000014 (oldest_compatible
-- 14): their session check reads claim_gate, and their ends do not write
-- work_fencing, so beside newer binaries a claim could commit on a stale
-- snapshot. Stop every older component before this migration runs (they
-- fail their session checks once it has: 42P01).
--
-- bmdb:rerunnable (safe to run again from any partial state; see migrations.go)
ALTER TABLE work_fencing ADD COLUMN IF NOT EXISTS version INT8 NOT NULL DEFAULT 0;

-- Whether the pair has a live claim, as its last claim or end wrote it: a
-- hint that lets a claim skip claimed pairs without reading the work
-- table, whose key stays the arbiter. Pairs claimed when this runs read
-- FALSE until their end; a claim then finds their work row and skips them.
ALTER TABLE work_fencing ADD COLUMN IF NOT EXISTS claimed BOOLEAN NOT NULL DEFAULT FALSE;

-- 000009's CHECK (token > 0), by the name each engine gave it.
ALTER TABLE work_fencing DROP CONSTRAINT IF EXISTS work_fencing_token_check;
ALTER TABLE work_fencing DROP CONSTRAINT IF EXISTS check_token;
ALTER TABLE work_fencing ADD CONSTRAINT work_fencing_token_check CHECK (token >= 0);

DROP TABLE IF EXISTS claim_gate;

INSERT INTO bmdb_schema_compat (version, oldest_compatible) VALUES (14, 14)
ON CONFLICT (version) DO NOTHING;
