-- 000007_claim_id: every claim gets an identity of its own, and history
-- rows name the claim they belong to. Finish, Cancel and Fail fence on it,
-- so that a retried end of a claim (after an ambiguous COMMIT) can never end
-- a newer claim of the same session on the same machine.
--
-- Compatibility: additive. Binaries built for 000001-000006 insert claims
-- without it (the default fills it) and fence on (machine, process,
-- session) as before; their history rows have no claim_id.
--
-- bmdb:rerunnable (safe to run again from any partial state; see migrations.go)
ALTER TABLE work ADD COLUMN IF NOT EXISTS claim_id UUID NOT NULL DEFAULT gen_random_uuid();
ALTER TABLE work_history ADD COLUMN IF NOT EXISTS claim_id UUID;
