DELETE FROM bmdb_app_schema_compat WHERE application = 'burnin' AND version = 2;
ALTER TABLE machine_burned_in DROP COLUMN burn_in_minutes;
