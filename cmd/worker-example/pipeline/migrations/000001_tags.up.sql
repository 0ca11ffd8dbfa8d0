-- 000001_tags: the pipeline's tag tables, one per stage done (a row
-- records that the stage is done for a machine; the stages' retrievals
-- join them), and the stage views that bmdb's web pages and bmdbctl read.
--
-- The tables are created IF NOT EXISTS: a database migrated by bmdb before
-- its version 12 has them already, created by bmdb's old 000002, with
-- their rows, and keeps both.
--
-- Compatibility: the first migration of the application.
--
-- bmdb:rerunnable (safe to run again from any partial state)
CREATE TABLE IF NOT EXISTS machine_provided (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    provider TEXT NOT NULL,
    provided_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS machine_agent_started (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    agent_version TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS machine_os_installed (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    os_image TEXT NOT NULL,
    installed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- app_stages: the pipeline's stages in order, under the name bmdb's pages
-- look for.
CREATE OR REPLACE VIEW app_stages AS
SELECT 'new'::TEXT AS stage, 1::INT8 AS position, 'created, not provided yet'::TEXT AS description
UNION ALL SELECT 'provided', 2, 'provided by the data center, agent not started'
UNION ALL SELECT 'agent-started', 3, 'agent running, OS not installed'
UNION ALL SELECT 'os-installed', 4, 'OS installed: done';

-- app_machine_stages: each machine's stage, the furthest tag it has.
CREATE OR REPLACE VIEW app_machine_stages AS
SELECT m.machine_id,
       CASE
           WHEN o.machine_id IS NOT NULL THEN 'os-installed'
           WHEN a.machine_id IS NOT NULL THEN 'agent-started'
           WHEN p.machine_id IS NOT NULL THEN 'provided'
           ELSE 'new'
       END AS stage
FROM machines m
LEFT JOIN machine_provided p ON p.machine_id = m.machine_id
LEFT JOIN machine_agent_started a ON a.machine_id = m.machine_id
LEFT JOIN machine_os_installed o ON o.machine_id = m.machine_id;

-- app_machine_tags: each machine's tags, for its page.
CREATE OR REPLACE VIEW app_machine_tags AS
SELECT machine_id, 'provided' AS tag, provider AS value, provided_at AS at FROM machine_provided
UNION ALL
SELECT machine_id, 'agent started', agent_version, started_at FROM machine_agent_started
UNION ALL
SELECT machine_id, 'OS installed', os_image, installed_at FROM machine_os_installed;
