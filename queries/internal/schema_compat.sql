-- name: SchemaCompatOldest :one
-- SchemaCompatOldest returns the oldest schema version whose binaries still
-- work with every migration newer than known_version, and how many such
-- migrations declared it (fewer than the versions between means some did
-- not: treat them as breaking).
SELECT COALESCE(max(oldest_compatible), 0)::INT8 AS oldest_compatible, count(*)::INT8 AS declared
FROM bmdb_schema_compat
WHERE version > sqlc.arg(known_version)::INT8 AND version <= sqlc.arg(database_version)::INT8;

-- name: AppSchemaCompatOldest :one
-- AppSchemaCompatOldest is SchemaCompatOldest for an application's own
-- migrations (migrations.Application), declared in bmdb_app_schema_compat.
SELECT COALESCE(max(oldest_compatible), 0)::INT8 AS oldest_compatible, count(*)::INT8 AS declared
FROM bmdb_app_schema_compat
WHERE application = sqlc.arg(application)::TEXT
  AND version > sqlc.arg(known_version)::INT8 AND version <= sqlc.arg(database_version)::INT8;
