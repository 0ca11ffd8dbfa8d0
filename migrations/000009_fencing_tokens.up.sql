-- 000009_fencing_tokens: a fencing token per claim, for side effects
-- outside the database. work_fencing keeps, per (machine, process), the
-- token of the latest claim; every claim increments it in the statement
-- that claims, so a later claim always carries a larger token than any
-- earlier one, whichever session took it. History rows record the token
-- of the claim they belong to.
--
-- Compatibility: additive (a new table, a nullable column). Binaries built
-- for 000001-000008 claim without tokens (the next token-aware claim still
-- increments past every token handed out) and never read the column.
--
-- bmdb:rerunnable (safe to run again from any partial state; see migrations.go)
CREATE TABLE IF NOT EXISTS work_fencing (
    machine_id UUID NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    process TEXT NOT NULL CHECK (length(process) BETWEEN 1 AND 128),
    token INT8 NOT NULL CHECK (token > 0),
    PRIMARY KEY (machine_id, process)
);
ALTER TABLE work_history ADD COLUMN IF NOT EXISTS fencing_token INT8;
