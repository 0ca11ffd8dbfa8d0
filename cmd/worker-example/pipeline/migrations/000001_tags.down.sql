-- Reverts 000001_tags.
DROP VIEW IF EXISTS app_machine_tags;
DROP VIEW IF EXISTS app_machine_stages;
DROP VIEW IF EXISTS app_stages;
DROP TABLE IF EXISTS machine_os_installed;
DROP TABLE IF EXISTS machine_agent_started;
DROP TABLE IF EXISTS machine_provided;
