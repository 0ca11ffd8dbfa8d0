-- Reverts 000006_schema_compat.
DROP TABLE IF EXISTS bmdb_schema_compat;
