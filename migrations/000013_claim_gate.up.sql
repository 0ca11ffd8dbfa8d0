-- 000013_claim_gate: the table whose lock serialises the batch
-- transactions (claims and ends) of every connection on PostgreSQL. Its
-- one row says until when the gate is on: a process whose batch failed
-- with a serialization error (another process's batch ran beside it) sets
-- it 30 s ahead, and every session check reads it, so every process turns
-- the gate on at its next transaction. While it is on, a batch
-- transaction's first statement is LOCK TABLE claim_gate IN EXCLUSIVE
-- MODE, taken before the transaction's snapshot, so that batches of
-- different processes neither abort each other
-- (PostgreSQL's SERIALIZABLE tracks reads of the small, hot work index per
-- page) nor miss each other's claims. Unused on CockroachDB, whose
-- conflicts are per key (see Config.ClaimConcurrency).
--
-- Compatibility: additive (a table). Binaries before 000013 do not take
-- the lock; they still claim correctly beside newer ones, with the
-- serialization retries this table avoids.
--
-- bmdb:rerunnable (safe to run again from any partial state; see migrations.go)
CREATE TABLE IF NOT EXISTS claim_gate (
    gate BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (gate),
    until TIMESTAMPTZ NOT NULL
);

INSERT INTO bmdb_schema_compat (version, oldest_compatible) VALUES (13, 12)
ON CONFLICT (version) DO NOTHING;
