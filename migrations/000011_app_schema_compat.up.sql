-- 000011_app_schema_compat: the rolling-upgrade declarations of
-- applications' own migrations (migrations.Application), the counterpart of
-- bmdb_schema_compat for each application's version table. An
-- application's migration N inserts (application, N, oldest_compatible):
-- the oldest version of that application's schema whose binaries still
-- work after it.
--
-- Compatibility: additive (a new table). Binaries built for 000001-000010
-- keep working.
--
-- bmdb:rerunnable (safe to run again from any partial state; see migrations.go)
CREATE TABLE IF NOT EXISTS bmdb_app_schema_compat (
    application TEXT NOT NULL CHECK (length(application) BETWEEN 1 AND 40),
    version INT8 NOT NULL,
    oldest_compatible INT8 NOT NULL CHECK (oldest_compatible >= 1 AND oldest_compatible <= version),
    PRIMARY KEY (application, version)
);
INSERT INTO bmdb_schema_compat (version, oldest_compatible) VALUES (11, 1)
ON CONFLICT (version) DO NOTHING;
