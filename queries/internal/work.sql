-- name: WorkClaimStates :many
-- WorkClaimStates tells, for each of machine_ids, in their order, why it could
-- not be claimed for process: whether it is a machine at all, whether it
-- is in backoff, whether its work_fencing row exists (a pair without one
-- cannot be claimed until WorkFencingEnsure made it), and which session
-- holds its claim (NULL: none) and whether that session is alive. A claim
-- being made by a transaction not yet committed is not seen: such a
-- machine has no holder here.
SELECT
    EXISTS (SELECT 1 FROM machines m WHERE m.machine_id = c.machine_id) AS known,
    EXISTS (
        SELECT 1 FROM work_backoff b
        WHERE b.machine_id = c.machine_id AND b.process = sqlc.arg(process)::TEXT
          AND b.until > now()
    ) AS in_backoff,
    EXISTS (
        SELECT 1 FROM work_fencing f
        WHERE f.machine_id = c.machine_id AND f.process = sqlc.arg(process)::TEXT
    ) AS fenced,
    w.session_id AS holder,
    COALESCE(s.deadline > statement_timestamp(), FALSE)::BOOLEAN AS holder_live
FROM unnest(sqlc.arg(machine_ids)::UUID[]) WITH ORDINALITY AS c (machine_id, ord)
LEFT JOIN work w ON w.machine_id = c.machine_id AND w.process = sqlc.arg(process)::TEXT
LEFT JOIN sessions s ON s.session_id = w.session_id
ORDER BY c.ord;

-- name: WorkEndSession :many
-- WorkEndSession removes every claim of a session, recording the given event
-- (Canceled when the session closes cleanly, Abandoned when it had expired),
-- writes each pair's work_fencing row (an end, see WorkClaimMany), and
-- returns the process of each. The rows are dated by this statement's
-- clock, like the check that found the session expired (or alive).
WITH ended AS (
    DELETE FROM work WHERE work.session_id = sqlc.arg(session_id)
    RETURNING work.machine_id, work.process, work.session_id, work.claim_id
), fenced AS (
    UPDATE work_fencing f SET version = f.version + 1, claimed = FALSE
    FROM ended WHERE f.machine_id = ended.machine_id AND f.process = ended.process
    RETURNING f.machine_id, f.process, f.version
)
INSERT INTO work_history (machine_id, process, session_id, event, at, component_name, claim_id, seq)
SELECT ended.machine_id, ended.process, ended.session_id, sqlc.arg(event)::work_history_event,
       statement_timestamp(), sqlc.arg(component_name)::TEXT, ended.claim_id, fenced.version
FROM ended LEFT JOIN fenced ON fenced.machine_id = ended.machine_id AND fenced.process = ended.process
RETURNING work_history.process;

-- name: WorkAbandonOfSessions :many
-- WorkAbandonOfSessions removes every claim of the given (expired, locked)
-- sessions, recording Abandoned history with each claim's id, writes each
-- pair's work_fencing row (an end, see WorkClaimMany), and returns the
-- process of each. GC and takeovers run it between SessionLock... and
-- SessionDeleteMany, in one transaction. The rows' time is this
-- statement's, not the transaction's start: the locks judged the sessions
-- expired by their statements' clock, so an Abandoned row is never dated
-- before its session's deadline.
WITH gone AS (
    DELETE FROM work
    WHERE work.session_id = ANY (sqlc.arg(session_ids)::UUID[])
    RETURNING work.machine_id, work.process, work.session_id, work.claim_id
), fenced AS (
    UPDATE work_fencing f SET version = f.version + 1, claimed = FALSE
    FROM gone WHERE f.machine_id = gone.machine_id AND f.process = gone.process
    RETURNING f.machine_id, f.process, f.version
)
INSERT INTO work_history (machine_id, process, session_id, event, at, component_name, claim_id, seq)
SELECT gone.machine_id, gone.process, gone.session_id, 'Abandoned', statement_timestamp(),
       (SELECT s.component_name FROM sessions s WHERE s.session_id = gone.session_id), gone.claim_id, fenced.version
FROM gone LEFT JOIN fenced ON fenced.machine_id = gone.machine_id AND fenced.process = gone.process
RETURNING work_history.process;

-- name: WorkGet :one
-- WorkGet returns the claim of (machine, process), live or not.
SELECT * FROM work
WHERE machine_id = sqlc.arg(machine_id) AND process = sqlc.arg(process);

-- name: WorkFencingEnsure :many
-- WorkFencingEnsure creates the work_fencing row (token 0: no claim yet) of
-- each (machine, process) of machine_ids that is a machine and has none,
-- and returns the machines it created rows for. It runs on its own, never
-- inside a claim transaction: a row one transaction inserts is invisible
-- to the others until it commits, and a second insert of the same key
-- would wait for it, so claims only ever lock rows that exist
-- (WorkClaimMany). It reads a row before inserting one, so on PostgreSQL
-- it never waits for a claim or end holding the row; it waits only for a
-- concurrent WorkFencingEnsure of the same pair, one statement.
INSERT INTO work_fencing (machine_id, process, token, version)
SELECT m.machine_id, sqlc.arg(process)::TEXT, 0, 0
FROM machines m
WHERE m.machine_id = ANY (sqlc.arg(machine_ids)::UUID[])
  AND NOT EXISTS (
      SELECT 1 FROM work_fencing f
      WHERE f.machine_id = m.machine_id AND f.process = sqlc.arg(process)::TEXT
  )
ORDER BY m.machine_id
ON CONFLICT (machine_id, process) DO NOTHING
RETURNING machine_id;

-- name: WorkClaimMany :many
-- WorkClaimMany claims, in one statement, up to max_claims of the machines
-- offer (in their order) that are neither claimed for process nor in
-- backoff for it, records Started for each with its fencing token (one
-- more than the previous claim's) and its place in the pair's history
-- (seq: the pair's claim row's version), and returns the claimed machines
-- with their claim ids and tokens. It dates its rows by the clock as it
-- makes each claim (clock_timestamp()), after it locked the machine's
-- claim row and its slot; seq, not the date, orders a pair's history
-- (gateway clocks differ on CockroachDB).
--
-- It claims through each pair's work_fencing row, which every claim and
-- every end of the pair writes (this statement, WorkFinishMany,
-- WorkEndMany, WorkEndSession, WorkAbandonOfSessions), and nothing else
-- reads or locks:
--   - It locks, in the order of offer, FOR UPDATE SKIP LOCKED, the rows of
--     the candidates that its snapshot shows unclaimed and not in backoff,
--     until it holds max_claims, and claims those: two transactions never
--     claim the same pair at once, and a claim never waits for another's
--     claim or end of the same pair: it skips the pair. A pair without a
--     row (never claimed, WorkFencingEnsure has not run for it) is not
--     claimed either. Whether a pair is claimed it reads from the row's
--     claimed (which claims and ends write with the work row), and from
--     the work table only if that says claimed; the work table's keys stay
--     the arbiters (ON CONFLICT).
--   - PostgreSQL locks only the rows that pass the filters, up to the
--     LIMIT; CockroachDB locks every row the scan of offer fetches, before
--     the filters and the LIMIT (lock at fetch): there bmdb offers at most
--     as many candidates as the statement may claim, so that it locks
--     only what it claims (a candidate the snapshot shows claimed or in
--     backoff is locked too, for the transaction's length).
--   - It writes the rows it claims (token and version). Under snapshot
--     isolation (PostgreSQL's REPEATABLE READ) locking a row that a
--     transaction committed after this one's snapshot wrote fails with
--     40001: first committer wins, so a claim commits only if no claim or
--     end of the pair committed after its snapshot. Under SERIALIZABLE the
--     same holds.
-- The machine's own row is not touched: retrievals and foreign keys read
-- it, and on CockroachDB an exclusive lock blocks plain reads.
--
-- It returns, of the machines it was offered: unfenced, those without a
-- claim row (WorkFencingEnsure makes them, once per pair, outside any
-- claim transaction); expired_machines, those whose claim is held by a
-- session past its deadline (with sweep, every claim of the process held
-- so, through work_process_idx: a caller sweeps now and then, so that a
-- dead worker's claims end whatever its retrievals return), and
-- expired_sessions, those sessions (with, for a capped process with no
-- free slot, the expired sessions that hold its slots). It reads no more
-- than it was offered: on CockroachDB every row a transaction read and
-- another wrote before it committed may fail its read refresh. If
-- prefer_expired and there is such a claim, it claims nothing: the caller
-- takes those sessions over (Abandoned history for their claims, the
-- session deleted) and claims again, the freed candidates first, so that
-- a dead worker's machines are worked again at the first claim that sees
-- them rather than when the queue drains or garbage collection runs.
--
-- It enforces the process's controls (process_controls, see 000015): it
-- reads the row FOR SHARE (a plain read on CockroachDB, whose SERIALIZABLE
-- orders it against a change) and claims nothing if the row is missing
-- (controlled is false: ProcessControlEnsure makes it) or paused. With a
-- cap, each claim takes a free slot below it (process_slots, locked FOR
-- UPDATE SKIP LOCKED, filtered first on PostgreSQL: see
-- WorkClaimManyArbitrated for CockroachDB; work_slot_idx makes a slot one
-- claim's), and none while a claim holds a slot at or above the cap (the
-- cap was lowered): claim_cap is the cap (NULL: none), free_slots how many
-- slots it took.
--
-- It is also the claiming transaction's session check, first and, when no
-- statement follows it, last (see SessionCheck and SessionCheckBeforeCommit,
-- which it replaces there): live reads and locks the session's row,
-- nothing is claimed unless the session is alive at this statement, and it
-- lowers the transaction's idle_in_transaction_session_timeout to the time
-- the session has left (at most max_idle_ms). The statement returns one
-- row with alive, the controls' state and the arrays, and no claim if it
-- claimed nothing. Being the check, it comes right after the retrievals,
-- whose snapshot is then as fresh as can be when the candidates are locked.
WITH live AS (
    SELECT s.session_id,
           set_config('idle_in_transaction_session_timeout',
               GREATEST(1, LEAST(sqlc.arg(max_idle_ms)::INT8,
                   (EXTRACT(EPOCH FROM (s.deadline - statement_timestamp())) * 1000)::INT8))::TEXT || 'ms',
               true) AS idle_timeout
    FROM sessions s
    WHERE s.session_id = sqlc.arg(session_id)::UUID AND s.deadline > statement_timestamp()
    FOR KEY SHARE
), ctl AS (
    SELECT c.paused, c.claim_cap FROM process_controls c
    WHERE c.process = sqlc.arg(process)::TEXT
    FOR SHARE
), open AS (
    SELECT ctl.claim_cap FROM ctl WHERE NOT ctl.paused AND EXISTS (SELECT 1 FROM live)
), seen AS (
    SELECT f.machine_id, f.claimed FROM work_fencing f
    WHERE f.process = sqlc.arg(process)::TEXT AND f.machine_id = ANY (sqlc.arg(offer)::UUID[])
), expired AS (
    SELECT w.machine_id, w.session_id
    FROM seen JOIN work w ON w.machine_id = seen.machine_id AND w.process = sqlc.arg(process)::TEXT
    JOIN sessions s ON s.session_id = w.session_id
    WHERE seen.claimed AND s.deadline <= statement_timestamp()
    UNION
    SELECT w.machine_id, w.session_id
    FROM work w JOIN sessions s ON s.session_id = w.session_id
    WHERE sqlc.arg(sweep)::BOOLEAN AND w.process = sqlc.arg(process)::TEXT AND s.deadline <= statement_timestamp()
), slots AS (
    SELECT s.slot FROM process_slots s, open o
    WHERE s.process = sqlc.arg(process)::TEXT AND s.slot < o.claim_cap
      AND NOT EXISTS (
          SELECT 1 FROM work w WHERE w.process = sqlc.arg(process)::TEXT AND w.slot >= o.claim_cap
      )
      AND NOT EXISTS (
          SELECT 1 FROM work w WHERE w.process = sqlc.arg(process)::TEXT AND w.slot = s.slot
      )
    ORDER BY s.slot
    LIMIT sqlc.arg(max_claims)::INT8
    FOR UPDATE OF s SKIP LOCKED
), slot_holders AS (
    SELECT w.session_id FROM open o, work w JOIN sessions s ON s.session_id = w.session_id
    WHERE o.claim_cap IS NOT NULL AND NOT EXISTS (SELECT 1 FROM slots)
      AND w.process = sqlc.arg(process)::TEXT AND w.slot IS NOT NULL
      AND s.deadline <= statement_timestamp()
), locked AS (
    SELECT f.machine_id FROM work_fencing f
    WHERE f.process = sqlc.arg(process)::TEXT AND f.machine_id = ANY (sqlc.arg(offer)::UUID[])
      AND EXISTS (SELECT 1 FROM open o WHERE o.claim_cap IS NULL OR EXISTS (SELECT 1 FROM slots))
      AND NOT (sqlc.arg(prefer_expired)::BOOLEAN AND EXISTS (SELECT 1 FROM expired))
      AND (NOT f.claimed OR NOT EXISTS (
          SELECT 1 FROM work w WHERE w.machine_id = f.machine_id AND w.process = f.process
      ))
      AND NOT EXISTS (
          SELECT 1 FROM work_backoff b
          WHERE b.machine_id = f.machine_id AND b.process = f.process AND b.until > now()
      )
    ORDER BY array_position(sqlc.arg(offer)::UUID[], f.machine_id)
    LIMIT sqlc.arg(max_claims)::INT8
    FOR UPDATE SKIP LOCKED
), picks AS (
    SELECT l.machine_id, sl.slot
    FROM (SELECT locked.machine_id,
                 row_number() OVER (ORDER BY array_position(sqlc.arg(offer)::UUID[], locked.machine_id)) AS n
          FROM locked) AS l
    LEFT JOIN (SELECT slots.slot, row_number() OVER (ORDER BY slots.slot) AS n FROM slots) AS sl ON sl.n = l.n
    WHERE sl.slot IS NOT NULL OR EXISTS (SELECT 1 FROM open WHERE open.claim_cap IS NULL)
), claim AS (
    INSERT INTO work (machine_id, process, session_id, started_at, slot)
    SELECT picks.machine_id, sqlc.arg(process)::TEXT, sqlc.arg(session_id)::UUID, clock_timestamp(), picks.slot
    FROM picks
    ON CONFLICT DO NOTHING
    RETURNING machine_id, process, session_id, started_at, claim_id
), fence AS (
    UPDATE work_fencing f SET token = f.token + 1, version = f.version + 1, claimed = TRUE
    FROM claim WHERE f.machine_id = claim.machine_id AND f.process = claim.process
    RETURNING f.machine_id, f.token, f.version
), started AS (
    INSERT INTO work_history (machine_id, process, session_id, event, at, component_name, claim_id, fencing_token, seq)
    SELECT claim.machine_id, claim.process, claim.session_id, 'Started', claim.started_at,
           sqlc.arg(component_name)::TEXT, claim.claim_id, fence.token, fence.version
    FROM claim JOIN fence ON fence.machine_id = claim.machine_id
    RETURNING work_history.machine_id, work_history.claim_id, work_history.fencing_token
)
SELECT EXISTS (SELECT 1 FROM live) AS alive,
       EXISTS (SELECT 1 FROM ctl) AS controlled,
       EXISTS (SELECT 1 FROM ctl WHERE ctl.paused) AS paused,
       (SELECT ctl.claim_cap FROM ctl) AS claim_cap,
       (SELECT count(*) FROM slots)::INT8 AS free_slots,
       (SELECT array_agg(c.machine_id) FROM unnest(sqlc.arg(offer)::UUID[]) AS c (machine_id)
        WHERE NOT EXISTS (SELECT 1 FROM seen WHERE seen.machine_id = c.machine_id))::UUID[] AS unfenced,
       (SELECT array_agg(expired.machine_id) FROM expired)::UUID[] AS expired_machines,
       (SELECT array_agg(DISTINCT h.session_id) FROM (
            SELECT expired.session_id FROM expired UNION ALL SELECT slot_holders.session_id FROM slot_holders
        ) AS h)::UUID[] AS expired_sessions,
       started.machine_id, started.claim_id, started.fencing_token
FROM (SELECT 1) AS one LEFT JOIN started ON TRUE;

-- name: WorkClaimManyArbitrated :many
-- WorkClaimManyArbitrated is WorkClaimMany for CockroachDB, where a locking
-- read locks every row its scan fetches, before its filters and its LIMIT
-- (lock at fetch): WorkClaimMany's FOR UPDATE of process_slots would lock
-- every slot of the process, free or held, and a concurrent claim of the
-- process would skip them all and find its cap reached. Here the slots are
-- not locked: each claim takes free slots as its snapshot shows them (a
-- plain read), starting from slot_start modulo the cap so that concurrent
-- claims spread over them, and work_slot_idx, the unique key of (process,
-- slot), arbitrates: of two claims that took the same slot, the second
-- waits for the first and then fails (a serialization failure, retried)
-- or, if the first rolled back, claims. It locks nothing but the claim
-- rows of what it offers. Everything else is WorkClaimMany's.
WITH live AS (
    SELECT s.session_id,
           set_config('idle_in_transaction_session_timeout',
               GREATEST(1, LEAST(sqlc.arg(max_idle_ms)::INT8,
                   (EXTRACT(EPOCH FROM (s.deadline - statement_timestamp())) * 1000)::INT8))::TEXT || 'ms',
               true) AS idle_timeout
    FROM sessions s
    WHERE s.session_id = sqlc.arg(session_id)::UUID AND s.deadline > statement_timestamp()
    FOR KEY SHARE
), ctl AS (
    SELECT c.paused, c.claim_cap FROM process_controls c
    WHERE c.process = sqlc.arg(process)::TEXT
    FOR SHARE
), open AS (
    SELECT ctl.claim_cap FROM ctl WHERE NOT ctl.paused AND EXISTS (SELECT 1 FROM live)
), seen AS (
    SELECT f.machine_id, f.claimed FROM work_fencing f
    WHERE f.process = sqlc.arg(process)::TEXT AND f.machine_id = ANY (sqlc.arg(offer)::UUID[])
), expired AS (
    SELECT w.machine_id, w.session_id
    FROM seen JOIN work w ON w.machine_id = seen.machine_id AND w.process = sqlc.arg(process)::TEXT
    JOIN sessions s ON s.session_id = w.session_id
    WHERE seen.claimed AND s.deadline <= statement_timestamp()
    UNION
    SELECT w.machine_id, w.session_id
    FROM work w JOIN sessions s ON s.session_id = w.session_id
    WHERE sqlc.arg(sweep)::BOOLEAN AND w.process = sqlc.arg(process)::TEXT AND s.deadline <= statement_timestamp()
), slots AS (
    SELECT s.slot, (s.slot + o.claim_cap - sqlc.arg(slot_start)::INT8 % o.claim_cap) % o.claim_cap AS ord
    FROM process_slots s, open o
    WHERE s.process = sqlc.arg(process)::TEXT AND s.slot < o.claim_cap
      AND NOT EXISTS (
          SELECT 1 FROM work w WHERE w.process = sqlc.arg(process)::TEXT AND w.slot >= o.claim_cap
      )
      AND NOT EXISTS (
          SELECT 1 FROM work w WHERE w.process = sqlc.arg(process)::TEXT AND w.slot = s.slot
      )
    ORDER BY ord
    LIMIT sqlc.arg(max_claims)::INT8
), slot_holders AS (
    SELECT w.session_id FROM open o, work w JOIN sessions s ON s.session_id = w.session_id
    WHERE o.claim_cap IS NOT NULL AND NOT EXISTS (SELECT 1 FROM slots)
      AND w.process = sqlc.arg(process)::TEXT AND w.slot IS NOT NULL
      AND s.deadline <= statement_timestamp()
), locked AS (
    SELECT f.machine_id FROM work_fencing f
    WHERE f.process = sqlc.arg(process)::TEXT AND f.machine_id = ANY (sqlc.arg(offer)::UUID[])
      AND EXISTS (SELECT 1 FROM open o WHERE o.claim_cap IS NULL OR EXISTS (SELECT 1 FROM slots))
      AND NOT (sqlc.arg(prefer_expired)::BOOLEAN AND EXISTS (SELECT 1 FROM expired))
      AND (NOT f.claimed OR NOT EXISTS (
          SELECT 1 FROM work w WHERE w.machine_id = f.machine_id AND w.process = f.process
      ))
      AND NOT EXISTS (
          SELECT 1 FROM work_backoff b
          WHERE b.machine_id = f.machine_id AND b.process = f.process AND b.until > now()
      )
    ORDER BY array_position(sqlc.arg(offer)::UUID[], f.machine_id)
    LIMIT sqlc.arg(max_claims)::INT8
    FOR UPDATE SKIP LOCKED
), picks AS (
    SELECT l.machine_id, sl.slot
    FROM (SELECT locked.machine_id,
                 row_number() OVER (ORDER BY array_position(sqlc.arg(offer)::UUID[], locked.machine_id)) AS n
          FROM locked) AS l
    LEFT JOIN (SELECT slots.slot, row_number() OVER (ORDER BY slots.ord) AS n FROM slots) AS sl ON sl.n = l.n
    WHERE sl.slot IS NOT NULL OR EXISTS (SELECT 1 FROM open WHERE open.claim_cap IS NULL)
), claim AS (
    INSERT INTO work (machine_id, process, session_id, started_at, slot)
    SELECT picks.machine_id, sqlc.arg(process)::TEXT, sqlc.arg(session_id)::UUID, clock_timestamp(), picks.slot
    FROM picks
    ON CONFLICT DO NOTHING
    RETURNING machine_id, process, session_id, started_at, claim_id
), fence AS (
    UPDATE work_fencing f SET token = f.token + 1, version = f.version + 1, claimed = TRUE
    FROM claim WHERE f.machine_id = claim.machine_id AND f.process = claim.process
    RETURNING f.machine_id, f.token, f.version
), started AS (
    INSERT INTO work_history (machine_id, process, session_id, event, at, component_name, claim_id, fencing_token, seq)
    SELECT claim.machine_id, claim.process, claim.session_id, 'Started', claim.started_at,
           sqlc.arg(component_name)::TEXT, claim.claim_id, fence.token, fence.version
    FROM claim JOIN fence ON fence.machine_id = claim.machine_id
    RETURNING work_history.machine_id, work_history.claim_id, work_history.fencing_token
)
SELECT EXISTS (SELECT 1 FROM live) AS alive,
       EXISTS (SELECT 1 FROM ctl) AS controlled,
       EXISTS (SELECT 1 FROM ctl WHERE ctl.paused) AS paused,
       (SELECT ctl.claim_cap FROM ctl) AS claim_cap,
       (SELECT count(*) FROM slots)::INT8 AS free_slots,
       (SELECT array_agg(c.machine_id) FROM unnest(sqlc.arg(offer)::UUID[]) AS c (machine_id)
        WHERE NOT EXISTS (SELECT 1 FROM seen WHERE seen.machine_id = c.machine_id))::UUID[] AS unfenced,
       (SELECT array_agg(expired.machine_id) FROM expired)::UUID[] AS expired_machines,
       (SELECT array_agg(DISTINCT h.session_id) FROM (
            SELECT expired.session_id FROM expired UNION ALL SELECT slot_holders.session_id FROM slot_holders
        ) AS h)::UUID[] AS expired_sessions,
       started.machine_id, started.claim_id, started.fencing_token
FROM (SELECT 1) AS one LEFT JOIN started ON TRUE;

-- name: WorkFinishMany :many
-- WorkFinishMany ends, as Finished, the claims claim_ids of process on
-- machine_ids that the session still holds, writes their work_fencing rows
-- (see WorkClaimMany), clears their backoffs, and returns their claim ids:
-- those missing were no longer held (the fence of a batch's Finishes). Like
-- every end statement, it dates its rows by statement_timestamp(), not by
-- the transaction's start: sorted by time, a machine's history is the
-- order of its events (a takeover's Abandoned before the new claim's
-- Started).
--
-- It is also the transaction's session check, as WorkClaimMany is: it ends
-- nothing unless the session is alive at this statement, lowers the idle
-- timeout to the session's lease, and returns one row with alive and no
-- claim id if it ended nothing. A batch runs it last, after the commit
-- callbacks, so that it is the check before COMMIT.
WITH live AS (
    SELECT s.session_id,
           set_config('idle_in_transaction_session_timeout',
               GREATEST(1, LEAST(sqlc.arg(max_idle_ms)::INT8,
                   (EXTRACT(EPOCH FROM (s.deadline - statement_timestamp())) * 1000)::INT8))::TEXT || 'ms',
               true) AS idle_timeout
    FROM sessions s
    WHERE s.session_id = sqlc.arg(session_id)::UUID AND s.deadline > statement_timestamp()
    FOR KEY SHARE
), ended AS (
    DELETE FROM work
    WHERE work.process = sqlc.arg(process)::TEXT AND work.session_id = sqlc.arg(session_id)::UUID
      AND work.machine_id = ANY (sqlc.arg(machine_ids)::UUID[])
      AND work.claim_id = ANY (sqlc.arg(claim_ids)::UUID[])
      AND EXISTS (SELECT 1 FROM live)
    RETURNING work.machine_id, work.process, work.session_id, work.claim_id
), fenced AS (
    UPDATE work_fencing f SET version = f.version + 1, claimed = FALSE
    FROM ended WHERE f.machine_id = ended.machine_id AND f.process = ended.process
    RETURNING f.machine_id, f.version
), cleared AS (
    DELETE FROM work_backoff
    WHERE work_backoff.machine_id IN (SELECT ended.machine_id FROM ended)
      AND work_backoff.process = sqlc.arg(process)::TEXT
    RETURNING work_backoff.machine_id
), finished AS (
    INSERT INTO work_history (machine_id, process, session_id, event, at, component_name, claim_id, seq)
    SELECT ended.machine_id, ended.process, ended.session_id, 'Finished', statement_timestamp(),
           sqlc.arg(component_name)::TEXT, ended.claim_id, fenced.version
    FROM ended LEFT JOIN fenced ON fenced.machine_id = ended.machine_id
    RETURNING work_history.claim_id
)
SELECT EXISTS (SELECT 1 FROM live) AS alive, finished.claim_id
FROM (SELECT 1) AS one LEFT JOIN finished ON TRUE;

-- name: WorkEndMany :many
-- WorkEndMany ends, with the given event (Canceled or Failed) and causes
-- (aligned with claim_ids; '' for none), the claims claim_ids of process
-- on machine_ids that the session still holds, writes their work_fencing
-- rows (see WorkClaimMany), and returns their claim ids: those missing
-- were no longer held (the fence of a batch's ends).
WITH ended AS (
    DELETE FROM work
    WHERE work.process = sqlc.arg(process)::TEXT AND work.session_id = sqlc.arg(session_id)::UUID
      AND work.machine_id = ANY (sqlc.arg(machine_ids)::UUID[])
      AND work.claim_id = ANY (sqlc.arg(claim_ids)::UUID[])
    RETURNING work.machine_id, work.process, work.session_id, work.claim_id
), fenced AS (
    UPDATE work_fencing f SET version = f.version + 1, claimed = FALSE
    FROM ended WHERE f.machine_id = ended.machine_id AND f.process = ended.process
    RETURNING f.machine_id, f.version
), causes AS (
    SELECT (sqlc.arg(claim_ids)::UUID[])[i] AS claim_id, (sqlc.arg(causes)::TEXT[])[i] AS cause
    FROM generate_series(1, array_length(sqlc.arg(claim_ids)::UUID[], 1)) AS i
)
INSERT INTO work_history (machine_id, process, session_id, event, at, failed_cause, component_name, claim_id, seq)
SELECT ended.machine_id, ended.process, ended.session_id, sqlc.arg(event)::work_history_event,
       statement_timestamp(), NULLIF(causes.cause, ''), sqlc.arg(component_name)::TEXT, ended.claim_id, fenced.version
FROM ended JOIN causes ON causes.claim_id = ended.claim_id
LEFT JOIN fenced ON fenced.machine_id = ended.machine_id
RETURNING work_history.claim_id;
