-- 000008_claim_id_compat: records that 000007 keeps every older binary
-- working. A file of its own: CockroachDB does not let a transaction use a
-- column it added, and this changes nothing but bmdb_schema_compat.
--
-- Compatibility: additive (a row).
--
-- bmdb:rerunnable (safe to run again from any partial state; see migrations.go)
INSERT INTO bmdb_schema_compat (version, oldest_compatible) VALUES (7, 1), (8, 1)
ON CONFLICT (version) DO NOTHING;
