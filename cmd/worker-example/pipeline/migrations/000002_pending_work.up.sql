-- 000002_pending_work: app_pending_work, the machines each stage's process
-- needs now (what its retrieval looks for, before bmdb leaves out claims
-- and backoffs), under the name bmdb's web overview looks for: it counts
-- those nobody works on among the machines waiting for the process, and
-- warns when no live session serves them.
--
--	app_pending_work (process TEXT, machine_id UUID)
--
-- Compatibility: additive (a view). Binaries of version 1 keep working.
--
-- bmdb:rerunnable (safe to run again from any partial state)
CREATE OR REPLACE VIEW app_pending_work AS
SELECT 'provide'::TEXT AS process, m.machine_id
FROM machines m
WHERE NOT EXISTS (SELECT 1 FROM machine_provided p WHERE p.machine_id = m.machine_id)
UNION ALL
SELECT 'start-agent', p.machine_id
FROM machine_provided p
WHERE NOT EXISTS (SELECT 1 FROM machine_agent_started a WHERE a.machine_id = p.machine_id)
UNION ALL
SELECT 'install-os', a.machine_id
FROM machine_agent_started a
WHERE NOT EXISTS (SELECT 1 FROM machine_os_installed o WHERE o.machine_id = a.machine_id);

INSERT INTO bmdb_app_schema_compat (application, version, oldest_compatible) VALUES ('pipeline', 2, 1)
ON CONFLICT (application, version) DO NOTHING;
