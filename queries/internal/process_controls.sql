-- name: ProcessControlEnsure :exec
-- ProcessControlEnsure creates the controls row of process (not paused, no
-- cap) if it has none. Every claim of the process reads that row
-- (WorkClaimMany) and claims nothing without it; it runs on its own,
-- outside any claim transaction, before the process's first claim.
INSERT INTO process_controls (process) VALUES (sqlc.arg(process))
ON CONFLICT (process) DO NOTHING;

-- name: ProcessControlLock :one
-- ProcessControlLock creates the controls row of process if it has none,
-- and returns it locked for the change that follows in the transaction:
-- the lock waits for the claims of the process in flight (they hold it
-- FOR SHARE), and claims that read the row before the change commits fail
-- or are serialized before it (see WorkClaimMany).
INSERT INTO process_controls (process) VALUES (sqlc.arg(process))
ON CONFLICT (process) DO UPDATE SET paused = process_controls.paused
RETURNING paused, claim_cap;

-- name: ProcessControlSet :exec
-- ProcessControlSet writes the controls of process (locked by
-- ProcessControlLock), with who changed them, when and why, and records
-- the change (action: pause, resume, cap or uncap) in
-- process_control_history.
WITH changed AS (
    UPDATE process_controls
    SET paused = sqlc.arg(paused), claim_cap = sqlc.narg(claim_cap)::INT8,
        changed_at = statement_timestamp(), changed_by = sqlc.arg(actor)::TEXT, reason = sqlc.arg(reason)::TEXT
    WHERE process = sqlc.arg(process)::TEXT
    RETURNING process
)
INSERT INTO process_control_history (process, action, claim_cap, at, actor, runtime_info, reason)
SELECT changed.process, sqlc.arg(action)::TEXT, sqlc.narg(claim_cap)::INT8, statement_timestamp(),
       sqlc.arg(actor)::TEXT, sqlc.arg(runtime_info)::TEXT, sqlc.arg(reason)::TEXT
FROM changed;

-- name: ProcessSlotsEnsure :exec
-- ProcessSlotsEnsure creates the slots 0..claim_cap-1 of process that do
-- not exist (slots at or above a lowered cap stay, unused).
INSERT INTO process_slots (process, slot)
SELECT sqlc.arg(process)::TEXT, s FROM generate_series(0, sqlc.arg(claim_cap)::INT8 - 1) AS s
ON CONFLICT (process, slot) DO NOTHING;

-- name: WorkSlotsAssign :execrows
-- WorkSlotsAssign gives each claim of process that holds no slot (made
-- while the process had no cap) a slot of its own above every slot held,
-- so that a new cap counts it: new claims wait until no live claim holds a
-- slot at or above the cap (WorkClaimMany). It runs after
-- ProcessControlLock, which waited for the claims in flight, at READ
-- COMMITTED on PostgreSQL so that it sees them.
UPDATE work SET slot = b.base + x.n - 1
FROM (SELECT w.machine_id, row_number() OVER (ORDER BY w.started_at, w.machine_id) AS n
      FROM work w WHERE w.process = sqlc.arg(process)::TEXT AND w.slot IS NULL) AS x,
     (SELECT COALESCE(max(w.slot) + 1, 0) AS base FROM work w WHERE w.process = sqlc.arg(process)::TEXT) AS b
WHERE work.process = sqlc.arg(process)::TEXT AND work.machine_id = x.machine_id;

-- name: ProcessControlDelete :one
-- ProcessControlDelete deletes the controls row of process, once the
-- claims of the process in flight have ended (they hold it FOR SHARE),
-- and records the deletion (action delete, with the cap it had) in
-- process_control_history; it returns whether the row was paused and its
-- cap, and no row if the process had no controls.
WITH deleted AS (
    DELETE FROM process_controls WHERE process = sqlc.arg(process)::TEXT
    RETURNING process, paused, claim_cap
), recorded AS (
    INSERT INTO process_control_history (process, action, claim_cap, at, actor, runtime_info, reason)
    SELECT deleted.process, 'delete', deleted.claim_cap, statement_timestamp(),
           sqlc.arg(actor)::TEXT, sqlc.arg(runtime_info)::TEXT, sqlc.arg(reason)::TEXT
    FROM deleted
    RETURNING id
)
SELECT deleted.paused, deleted.claim_cap FROM deleted;

-- name: ProcessSlotsDelete :execrows
-- ProcessSlotsDelete deletes the claim slots of process (made by
-- ProcessSlotsEnsure for its caps); the claims that hold one keep its
-- number in work.slot until they end.
DELETE FROM process_slots WHERE process = sqlc.arg(process)::TEXT;
