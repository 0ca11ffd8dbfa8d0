-- 000004_backoff_cleared: the BackoffCleared history event, an operator's
-- override of a backoff (Session.ClearBackoff, bmdbctl backoff clear).
--
-- Compatibility: additive. Older binaries never write it and read it as any
-- other event string. Kept alone in its file: neither engine lets a
-- transaction use an enum value it added.
--
-- bmdb:rerunnable (safe to run again from any partial state; see migrations.go)
ALTER TYPE work_history_event ADD VALUE IF NOT EXISTS 'BackoffCleared';
