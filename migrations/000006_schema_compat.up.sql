-- 000006_schema_compat: which older binaries each migration leaves working,
-- so that a rolling upgrade can run old and new binaries on one schema.
-- Every migration from here on inserts its row: oldest_compatible is the
-- oldest schema version whose binaries still work after it (its own version
-- for a breaking change). A binary that knows up to version L opens a
-- database at a newer version V only if every migration in (L, V] has
-- oldest_compatible <= L.
--
-- Compatibility: additive (a new table). Binaries built for 000001-000005
-- keep working.
--
-- bmdb:rerunnable (safe to run again from any partial state; see migrations.go)
CREATE TABLE IF NOT EXISTS bmdb_schema_compat (
    version INT8 PRIMARY KEY,
    oldest_compatible INT8 NOT NULL CHECK (oldest_compatible >= 1 AND oldest_compatible <= version)
);
INSERT INTO bmdb_schema_compat (version, oldest_compatible) VALUES
    (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)
ON CONFLICT (version) DO NOTHING;
