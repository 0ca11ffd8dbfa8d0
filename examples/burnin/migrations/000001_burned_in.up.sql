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
