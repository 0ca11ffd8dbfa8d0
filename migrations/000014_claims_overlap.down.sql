-- Reverts 000014_claims_overlap. Rows created before a first claim
-- (token 0) are dropped: 000009's check refuses them, and older binaries
-- create rows as they claim.
DELETE FROM bmdb_schema_compat WHERE version = 14;
CREATE TABLE IF NOT EXISTS claim_gate (
    gate BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (gate),
    until TIMESTAMPTZ NOT NULL
);
DELETE FROM work_fencing WHERE token = 0;
ALTER TABLE work_fencing DROP CONSTRAINT IF EXISTS work_fencing_token_check;
ALTER TABLE work_fencing ADD CONSTRAINT work_fencing_token_check CHECK (token > 0);
ALTER TABLE work_fencing DROP COLUMN IF EXISTS version;
ALTER TABLE work_fencing DROP COLUMN IF EXISTS claimed;
