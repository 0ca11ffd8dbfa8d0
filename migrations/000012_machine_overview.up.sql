-- 000012_machine_overview: the framework's schema holds no application's
-- stages. machine_status (000005) hard-coded the example pipeline's four
-- stages from its tag tables; it is dropped (the tables and their rows
-- stay: they are the example application's now), and machine_overview
-- gives each machine's claims and backoffs whatever the application.
-- Applications that have stages define the views app_stages and
-- app_machine_stages (and optionally app_machine_tags), which bmdb's web
-- pages and bmdbctl read when they exist (see package web).
--
-- Compatibility: breaking for binaries before 000012, whose web pages and
-- bmdbctl read machine_status: they refuse this schema (oldest_compatible
-- 12), so upgrade every component with it.
--
-- bmdb:rerunnable (safe to run again from any partial state; see migrations.go)
DROP VIEW IF EXISTS machine_status;

-- machine_overview: every machine, with its live claims, its claims held
-- by expired sessions (stuck until a takeover or GC), and its backoffs in
-- force.
CREATE OR REPLACE VIEW machine_overview AS
SELECT m.machine_id, m.machine_created_at,
       (SELECT count(*) FROM work w JOIN sessions s ON s.session_id = w.session_id
        WHERE w.machine_id = m.machine_id AND s.deadline > now()) AS live_claims,
       (SELECT count(*) FROM work w JOIN sessions s ON s.session_id = w.session_id
        WHERE w.machine_id = m.machine_id AND s.deadline <= now()) AS expired_claims,
       (SELECT count(*) FROM work_backoff b
        WHERE b.machine_id = m.machine_id AND b.until > now()) AS active_backoffs
FROM machines m;

INSERT INTO bmdb_schema_compat (version, oldest_compatible) VALUES (12, 12)
ON CONFLICT (version) DO NOTHING;
