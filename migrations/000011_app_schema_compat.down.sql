-- Reverts 000011_app_schema_compat.
DELETE FROM bmdb_schema_compat WHERE version = 11;
DROP TABLE IF EXISTS bmdb_app_schema_compat;
