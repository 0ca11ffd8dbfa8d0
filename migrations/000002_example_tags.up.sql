-- 000002_example_tags: tag tables of the example fleet pipeline
-- (cmd/worker-example): provide -> start agent -> install OS. A tag row
-- records that a stage is done for a machine; retrieval queries join them.
--
-- Compatibility: additive (new tables only). Binaries built for 000001 keep
-- working against this schema (recorded in bmdb_schema_compat by 000006).

CREATE TABLE machine_provided (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    provider TEXT NOT NULL,
    provided_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE machine_agent_started (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    agent_version TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE machine_os_installed (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    os_image TEXT NOT NULL,
    installed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
