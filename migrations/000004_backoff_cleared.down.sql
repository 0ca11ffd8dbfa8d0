-- Reverts 000004_backoff_cleared: nothing to do. Neither engine drops enum
-- values portably; the value stays, unused by older binaries, and
-- re-applying 000004 keeps it.
SELECT 1;
