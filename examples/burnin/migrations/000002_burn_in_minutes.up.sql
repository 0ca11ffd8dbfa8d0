-- 000002_burn_in_minutes: how long each burn-in ran, for capacity
-- planning. Nullable, so burn-in binaries built for 000001, which do not
-- write it, keep working.
--
-- Compatibility: additive (a nullable column). Binaries built for version
-- 1 of this application keep working, as the row below declares (bmdb.Open
-- of an older binary reads it during a rolling upgrade).
ALTER TABLE machine_burned_in ADD COLUMN burn_in_minutes INT8;
INSERT INTO bmdb_app_schema_compat (application, version, oldest_compatible) VALUES ('burnin', 2, 1);
