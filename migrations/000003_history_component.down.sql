-- Reverts 000003_history_component.
ALTER TABLE work_history DROP COLUMN IF EXISTS component_name;
