-- 000003_history_component: work_history.component_name, so that history
-- stays readable after the session row is gone.
--
-- Compatibility: additive (a nullable column). Binaries built for
-- 000001-000002 write history without it; readable_history (000005) falls
-- back to the session row. Kept alone in its file: CockroachDB cannot use a
-- column in the transaction that adds it.
--
-- bmdb:rerunnable (safe to run again from any partial state; see migrations.go)
ALTER TABLE work_history ADD COLUMN IF NOT EXISTS component_name TEXT;
