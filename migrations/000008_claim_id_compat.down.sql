-- Reverts 000008_claim_id_compat.
DELETE FROM bmdb_schema_compat WHERE version IN (7, 8);
