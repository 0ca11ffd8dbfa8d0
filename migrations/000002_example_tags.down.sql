-- Reverts 000002_example_tags: drops the example's tag tables.
DROP TABLE IF EXISTS machine_os_installed;
DROP TABLE IF EXISTS machine_agent_started;
DROP TABLE IF EXISTS machine_provided;
