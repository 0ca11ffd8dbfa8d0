-- Reverts 000002_pending_work.
DELETE FROM bmdb_app_schema_compat WHERE application = 'pipeline' AND version = 2;
DROP VIEW IF EXISTS app_pending_work;
