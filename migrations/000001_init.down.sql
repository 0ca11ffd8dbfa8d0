-- Reverts 000001_init: drops every bmdb table. All data is lost.
DROP TABLE IF EXISTS work_backoff;
DROP TABLE IF EXISTS work_history;
DROP TYPE IF EXISTS work_history_event;
DROP TABLE IF EXISTS work;
DROP TABLE IF EXISTS sessions;
DROP TABLE IF EXISTS machines;
