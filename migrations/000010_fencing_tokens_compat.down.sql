-- Reverts 000010_fencing_tokens_compat.
DELETE FROM bmdb_schema_compat WHERE version IN (9, 10);
