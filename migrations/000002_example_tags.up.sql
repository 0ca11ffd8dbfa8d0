-- 000002_example_tags: once the tag tables of the example pipeline
-- (machine_provided, machine_agent_started, machine_os_installed). They
-- belong to the example application now (cmd/worker-example/pipeline),
-- whose own first migration creates them IF NOT EXISTS: a database migrated
-- before keeps them and their rows, a new one gets them from the
-- application. This migration does nothing any more; its version stays so
-- that the numbering of recorded versions does not change.
--
-- Compatibility: none needed (no change).
SELECT 1;
