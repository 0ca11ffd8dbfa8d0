-- 000010_fencing_tokens_compat: records that 000009 keeps every older
-- binary working. A file of its own, like 000008: CockroachDB does not let
-- a transaction use a column it added.
--
-- Compatibility: additive (a row).
--
-- bmdb:rerunnable (safe to run again from any partial state; see migrations.go)
INSERT INTO bmdb_schema_compat (version, oldest_compatible) VALUES (9, 1), (10, 1)
ON CONFLICT (version) DO NOTHING;
