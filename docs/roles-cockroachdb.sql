-- Least-privilege roles for a bmdb database on CockroachDB: the same roles
-- as docs/roles.sql (PostgreSQL), which explains them, with two
-- differences: work_history.id is unique_rowid() there, so there is no
-- sequence to grant, and roles are created without a password, which an
-- insecure cluster refuses. On a secure cluster give each a password (or a
-- client certificate) afterwards:
--
--   ALTER ROLE bmdb_worker WITH PASSWORD 'change-me';
--
-- The worker role needs nothing on bmdb_migration_lock: with
-- Config.SkipMigrations, Open only reads the schema versions.

CREATE ROLE bmdb_worker LOGIN;
CREATE ROLE bmdb_operator LOGIN;

GRANT USAGE ON SCHEMA public TO bmdb_worker, bmdb_operator;

GRANT SELECT, INSERT, UPDATE, DELETE ON
    machines, sessions, work, work_history, work_backoff, work_fencing,
    process_controls, process_slots, process_control_history
TO bmdb_worker;
-- Components check the schema versions and their compatibility on Open.
GRANT SELECT ON schema_migrations, bmdb_schema_compat, bmdb_app_schema_compat TO bmdb_worker;
GRANT SELECT ON live_sessions, current_work, active_backoffs, readable_history, machine_overview, process_status TO bmdb_worker;

GRANT SELECT ON live_sessions, current_work, active_backoffs, readable_history, machine_overview, process_status, process_control_history TO bmdb_operator;
