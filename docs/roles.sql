-- Least-privilege roles for a bmdb database on PostgreSQL. On CockroachDB
-- use docs/roles-cockroachdb.sql (no sequence there, and no passwords on an
-- insecure cluster).
--
-- bmdb_migrator owns the schema: run migrations (bmdbctl migrate up, with
-- --app NAME --migrations DIR for an application's; migrations.Migrator.Up;
-- or the first component with migrations on) and bmdbctl migrate force as
-- this role; it alone needs bmdb_migration_lock.
-- bmdb_worker is what components run as, with Config.SkipMigrations = true:
-- DML on the tables, nothing else (no DDL, no TRUNCATE). Opening reads the
-- schema versions (schema_migrations, and each application's
-- <name>_schema_migrations) and takes no lock.
-- bmdb_operator is for people and dashboards: read-only on the views.
-- bmdbctl's write commands (backoff clear, pause, resume, cap, gc,
-- history prune) need bmdb_worker.
--
-- Replace the passwords, or use certificate authentication
-- (sslmode=verify-full in the DSN, which bmdb passes to the driver
-- unchanged). Run after the migrations, as the schema owner, and again after
-- migrations that add tables or views (or rely on the default privileges).
-- An application grants its own tables, views and version table the same
-- way; the example's, for instance:
--
--   GRANT SELECT, INSERT, UPDATE, DELETE ON machine_provided,
--       machine_agent_started, machine_os_installed TO bmdb_worker;
--   GRANT SELECT ON pipeline_schema_migrations, app_stages,
--       app_machine_stages, app_machine_tags, app_pending_work TO bmdb_worker, bmdb_operator;

CREATE ROLE bmdb_worker LOGIN PASSWORD 'change-me';
CREATE ROLE bmdb_operator LOGIN PASSWORD 'change-me';

GRANT USAGE ON SCHEMA public TO bmdb_worker, bmdb_operator;

GRANT SELECT, INSERT, UPDATE, DELETE ON
    machines, sessions, work, work_history, work_backoff, work_fencing,
    process_controls, process_slots, process_control_history
TO bmdb_worker;
-- work_history.id and process_control_history.id are BIGSERIALs, whose
-- sequences the worker draws from.
GRANT USAGE ON SEQUENCE work_history_id_seq, process_control_history_id_seq TO bmdb_worker;
-- Components check the schema versions and their compatibility on Open.
GRANT SELECT ON schema_migrations, bmdb_schema_compat, bmdb_app_schema_compat TO bmdb_worker;
GRANT SELECT ON live_sessions, current_work, active_backoffs, readable_history, machine_overview, process_status TO bmdb_worker;

GRANT SELECT ON live_sessions, current_work, active_backoffs, readable_history, machine_overview, process_status, process_control_history TO bmdb_operator;
