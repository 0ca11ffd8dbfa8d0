-- 000001_burned_in: the burn-in application's tags. A machine is racked
-- when the data center hands it over (the seeding step inserts the row),
-- and burned in once its burn-in passed (the burn-in worker's commit).
--
-- Compatibility: the first migration of the application.
CREATE TABLE machine_racked (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    rack TEXT NOT NULL,
    racked_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE machine_burned_in (
    machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    passed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The stages bmdb's web pages and bmdbctl show, under the names they look
-- for: each stage in order, and each machine's stage.
CREATE VIEW app_stages AS
SELECT 'racked'::TEXT AS stage, 1::INT8 AS position, 'racked, not burned in yet'::TEXT AS description
UNION ALL SELECT 'burned-in', 2, 'burn-in passed: done';

CREATE VIEW app_machine_stages AS
SELECT r.machine_id, CASE WHEN b.machine_id IS NULL THEN 'racked' ELSE 'burned-in' END AS stage
FROM machine_racked r LEFT JOIN machine_burned_in b ON b.machine_id = r.machine_id;
