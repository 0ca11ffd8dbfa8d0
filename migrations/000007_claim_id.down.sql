-- Reverts 000007_claim_id.
ALTER TABLE work_history DROP COLUMN IF EXISTS claim_id;
ALTER TABLE work DROP COLUMN IF EXISTS claim_id;
