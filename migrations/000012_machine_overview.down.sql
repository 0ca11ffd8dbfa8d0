-- Reverts 000012_machine_overview. machine_status is not restored: it read
-- the example application's tables, which bmdb no longer creates.
DELETE FROM bmdb_schema_compat WHERE version = 12;
DROP VIEW IF EXISTS machine_overview;
