DROP VIEW app_machine_stages;
DROP VIEW app_stages;
DROP TABLE machine_burned_in;
DROP TABLE machine_racked;
