DELETE FROM bmdb_schema_compat WHERE version = 13;
DROP TABLE IF EXISTS claim_gate;
