-- Reverts 000009_fencing_tokens.
ALTER TABLE work_history DROP COLUMN IF EXISTS fencing_token;
DROP TABLE IF EXISTS work_fencing;
