DROP TABLE machine_burned_in;
DROP TABLE machine_racked;
