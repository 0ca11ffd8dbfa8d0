-- name: SessionStart :one
-- SessionStart inserts a new session whose deadline is one interval from now
-- on the database clock, and returns its id.
INSERT INTO sessions (component_name, runtime_info, interval_seconds, deadline)
VALUES (
    sqlc.arg(component_name),
    sqlc.arg(runtime_info),
    sqlc.arg(interval_seconds)::FLOAT8,
    statement_timestamp() + sqlc.arg(interval_seconds)::FLOAT8 * INTERVAL '1 second'
)
RETURNING session_id;

-- name: SessionHeartbeat :execrows
-- SessionHeartbeat extends a live session's deadline by its interval. It affects
-- no row when the session has expired or is gone: an expired session is never
-- resurrected. It compares with statement_timestamp(), not now(): on
-- CockroachDB now() keeps its value across a transaction's retries, and a
-- retried poke must not extend a session that expired meanwhile. It updates
-- no key column, so on PostgreSQL it does not conflict with the FOR KEY
-- SHARE lock of SessionCheck. On CockroachDB that clause takes no lock
-- (see SessionCheck); the poke's write lands above the reads of the
-- session's open transactions, which fail their refresh only if pushed
-- above it (txlimit.go), and a check that meets the poke's uncommitted
-- write waits for it, one round trip (docs/cockroachdb.md).
UPDATE sessions
SET deadline = statement_timestamp() + interval_seconds * INTERVAL '1 second'
WHERE session_id = sqlc.arg(session_id) AND deadline > statement_timestamp();

-- name: SessionCheck :one
-- SessionCheck returns the session's id if it is alive on the database clock
-- (at this statement, not at the start of the transaction), and no row
-- otherwise. Every session transaction runs it first, and a takeover or GC
-- of the session deletes the row, which orders the two; how differs by
-- engine. On PostgreSQL, FOR KEY SHARE keeps the row from being deleted
-- until the transaction ends: a takeover or GC waits for the session's open
-- transactions (or aborts them). On CockroachDB, under SERIALIZABLE, FOR
-- KEY SHARE is a plain read (shared locking is off by default, and bmdb
-- pins it off), which waits for a writer of the row or a holder of an
-- exclusive lock on it: the delete lands above the transaction's read
-- timestamp, so the transaction either commits below it (serialized before
-- the takeover) or, pushed above it, fails its read refresh (40001) and
-- its retry finds no session. Either way no transaction of a superseded
-- session commits after the takeover.
SELECT session_id FROM sessions
WHERE session_id = sqlc.arg(session_id) AND deadline > statement_timestamp()
FOR KEY SHARE;

-- name: SessionCheckBeforeCommit :one
-- SessionCheckBeforeCommit is the last statement of every session
-- transaction: it returns the session's deadline as the transaction sees
-- it, if the session is alive at this statement, and lowers the
-- transaction's idle_in_transaction_session_timeout to the time left until
-- then (at most max_idle_ms), so that if the client stalls before COMMIT,
-- PostgreSQL ends the transaction at the deadline rather than commit it
-- later. CockroachDB takes the setting, but that a value set inside a
-- transaction changes the wait already under way there is not confirmed,
-- and bmdb does not rely on it: there the connection's own timeout
-- (SessionInterval) ends a stalled transaction at most one interval after
-- this check (docs/cockroachdb.md, "How fencing works here").
SELECT deadline,
       set_config('idle_in_transaction_session_timeout',
           GREATEST(1, LEAST(sqlc.arg(max_idle_ms)::INT8,
               (EXTRACT(EPOCH FROM (deadline - statement_timestamp())) * 1000)::INT8))::TEXT || 'ms',
           true) AS idle_timeout
FROM sessions
WHERE session_id = sqlc.arg(session_id) AND deadline > statement_timestamp()
FOR KEY SHARE;

-- name: SessionDelete :execrows
-- SessionDelete removes a session row; its work rows go with it (cascade).
-- Callers record their history first.
DELETE FROM sessions WHERE session_id = sqlc.arg(session_id);

-- name: SessionExpiryBound :one
-- SessionExpiryBound returns GC's expiry bound on the database clock: a
-- session whose deadline is before it expired more than grace_seconds ago.
SELECT (statement_timestamp() - sqlc.arg(grace_seconds)::FLOAT8 * INTERVAL '1 second')::TIMESTAMPTZ AS bound;

-- name: SessionListExpired :many
-- SessionListExpired returns up to row_limit sessions whose deadline is
-- before before (SessionExpiryBound's), by id, without locking them: a
-- scan of the sessions' primary index, the only index on the table, whose
-- entries heartbeats rewrite in place (a secondary index on deadline would
-- gain a deleted entry per heartbeat on CockroachDB, kept for
-- gc.ttlseconds). GC runs it outside the transactions that delete, on
-- CockroachDB in a read-only transaction at follower_read_timestamp()
-- (gc.go), so that it neither waits for nor holds up a heartbeat.
SELECT session_id FROM sessions
WHERE deadline < sqlc.arg(before)::TIMESTAMPTZ
ORDER BY session_id
LIMIT sqlc.arg(row_limit);

-- name: SessionLockExpired :many
-- SessionLockExpired locks, for deletion, those of session_ids (from
-- SessionListExpired) that still exist and are still expired before
-- before, by primary key, skipping those another transaction holds (a
-- takeover superseding them, another GC deleting them, or, on PostgreSQL,
-- a stalled transaction of the expired session holding its row FOR KEY
-- SHARE: a later pass collects it), and returns them. The lookup reads
-- only the given keys: on CockroachDB, which locks every row a locking
-- read fetches before its filters (lock at fetch), it locks only listed
-- sessions, which are expired (a listed session whose row the listing read
-- before a heartbeat moved it is locked for this short transaction too,
-- and not returned). The rows are locked in id order, the same in every
-- GC. A takeover's SessionLockIfExpired reads the same key: the two skip
-- each other. GC runs it before it writes, so that it takes the session
-- rows before their claims, in the same order as every session
-- transaction.
SELECT session_id FROM sessions
WHERE session_id = ANY (sqlc.arg(session_ids)::UUID[])
  AND deadline < sqlc.arg(before)::TIMESTAMPTZ
ORDER BY session_id
FOR UPDATE SKIP LOCKED;

-- name: SessionLockIfExpired :one
-- SessionLockIfExpired locks an expired session for deletion (a takeover of
-- its claims) and returns its id; no row if it is alive, gone, or being
-- superseded by another transaction (a takeover, or GC: SessionLockExpired
-- locks the same key), which it skips rather than wait for. On
-- PostgreSQL the lock (NO KEY UPDATE) does not conflict with the FOR KEY
-- SHARE of the expired session's own transactions; the DELETE that follows
-- does. On CockroachDB it is an exclusive lock, which a plain read waits
-- for: a check of the expired session waits for the takeover to end, and
-- then finds no session (see Mechanism in bmdb's package doc).
SELECT session_id FROM sessions
WHERE session_id = sqlc.arg(session_id) AND deadline <= statement_timestamp()
FOR NO KEY UPDATE SKIP LOCKED;

-- name: SessionDeleteMany :execrows
-- SessionDeleteMany removes the given sessions (locked by
-- SessionLockExpired or SessionLockIfExpired); callers first end their
-- claims with WorkAbandonOfSessions.
DELETE FROM sessions WHERE session_id = ANY (sqlc.arg(session_ids)::UUID[]);
