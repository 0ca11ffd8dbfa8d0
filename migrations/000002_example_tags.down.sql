-- Reverts 000002_example_tags: nothing (the tag tables are the example
-- application's, and no bmdb migration drops an application's table).
SELECT 1;
