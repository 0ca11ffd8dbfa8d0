// Package bmdb lets a fleet of background workers share one SQL database
// (CockroachDB, or PostgreSQL) and claim its machines one at a time without
// stepping on each other.
//
// # Mechanism
//
// Sessions are heartbeated rows. A component opens a Connection and starts a
// Session: a row in the sessions table with deadline = now() + interval on
// the database clock. The Session's one goroutine extends the deadline every
// interval/2 with an UPDATE that only matches while deadline > now(), so an
// expired session is never resurrected. Locally, the session counts as dead
// one interval after the start of its last successful heartbeat (by the
// monotonic clock), which is never later than the database's deadline:
// transient errors are retried until then, and then the session ends
// (Done closes, Err and Context's cause wrap ErrSessionExpired).
//
// Claims are rows that die with their session. Session.Work inserts a row in
// the work table whose primary key is (machine, process): two live claims of
// the same machine for the same process cannot both commit. A claim whose
// session has expired blocks nobody: the next Work that wants it deletes
// that session in its own transaction, recording each of its claims as
// Abandoned, and takes the machine. Expired sessions nobody took over are
// deleted by garbage collection that every live session runs periodically.
//
// Every transaction re-checks its session. Session.Transact, Work, and the
// Work's Finish, Cancel and Fail run in SERIALIZABLE transactions whose first
// statement reads the session row and checks deadline > statement_timestamp(),
// and whose last statement, right before COMMIT, checks the local deadline
// and the database clock again; Finish, Cancel and Fail also delete their
// claim only if this session still holds it. A takeover or GC deletes the
// superseded session's row, and that write orders it against every open
// transaction of the session, by a mechanism that differs by engine:
//
//   - PostgreSQL: the first check locks the row FOR KEY SHARE, so the
//     takeover's delete waits for the transaction to end (or aborts it).
//   - CockroachDB: FOR KEY SHARE is a plain read under SERIALIZABLE (shared
//     locking is off by default, and bmdb pins it off on every connection:
//     on, the heartbeat's UPDATE would wait for every open transaction of
//     its session). The delete lands above the transaction's read
//     timestamp: the transaction either commits below it, serialized before
//     the takeover, or is pushed above it and fails its read refresh
//     (40001), and its retry finds no session. The heartbeat rewrites the
//     same row, so a transaction older than the closed timestamp (3 s),
//     whose commit is pushed, would fail its refresh on every attempt: an
//     attempt is bounded by Config.MaxTransactionDuration
//     (ErrTransactionTooLong).
//
// So a worker that was partitioned, stalled or killed commits nothing after
// it lost its claim.
//
// # Stalls and partitions
//
// A session ends locally by a timer at its local deadline, whatever its
// heartbeat is doing, and every call that touches the network is bounded by
// its context even when the network swallows packets: bmdb's driver wrapper
// cuts the socket when the call's context ends, and never reuses that
// connection (lib/pq alone would wait for the operating system). A Session's
// transactions run under its context, so none outlives the session.
//
// The server bounds a client that stalls or vanishes: each connection has
// lock_timeout = SessionInterval/4 and idle_in_transaction_session_timeout
// = SessionInterval, and the last check before COMMIT lowers the latter to
// the lease the session has left. A takeover (or GC) is never ordered after
// a transaction of the session it supersedes (see above): on PostgreSQL it
// waits for it, bounded by those timeouts; on CockroachDB it does not wait
// for its read, only for its writes (intents), and the pre-COMMIT check
// and the lowered idle timeout bound how long the stalled transaction
// stays open. One case is longer there: if the gateway node of a stalled
// transaction dies, its intents stay until CockroachDB finds its
// transaction record unheartbeated, about 5 s (kv's transaction liveness
// threshold), so a takeover of what it wrote waits up to that long whatever
// the interval. What is guaranteed, with the figures measured by this
// package's tests (1 s interval, PostgreSQL 15):
//
//   - A worker's session context is cancelled no later than its deadline on
//     the database clock, on a black-holed network too (measured: within
//     ±0.5 ms of it, the precision of the measurement).
//   - No transaction of a session commits after another session took one of
//     its claims over, nor after the session's deadline on the database
//     clock: a transaction stopped anywhere between its first check and its
//     COMMIT, for longer than its lease, fails when it resumes and none of
//     its writes are visible (TestStalledTransactionCommitsNothingAfterTakeover,
//     TestPartitionBeforeCommitFencesFinish). The only window is a COMMIT
//     that reached the server before the deadline and is still being
//     processed at it.
//   - A takeover waits behind a stalled or partitioned holder for at most
//     about one interval after the holder's deadline, however long the
//     stall (measured: 70-120 ms).
//   - Side effects outside the database are not fenced by the database: use
//     Work.FencingToken, which grows with every claim of a (machine,
//     process), and have the external system refuse older tokens.
//
// Claims scale by groups. On PostgreSQL, SERIALIZABLE tracks reads of the
// small, hot work index per page, so concurrent claim transactions abort
// each other whatever machines they touch; a Connection therefore runs its
// claim transactions one at a time (Config.ClaimConcurrency, ends of claims
// first). Concurrent calls of a session for one process share
// transactions instead: its Work, WorkBatch, Finish, FinishWith, Cancel and
// Fail calls are served by one transaction with multi-row statements, the
// ends first, then the claims, each attempt taking in whatever is queued
// when it begins (up to Config.MaxGroupSize). Each caller gets its own
// result, nil only once its group committed; a lost claim or a failing
// callback fails only its own caller (the group is then retried one call
// at a time). worker.Loop relies on this: it claims for all its free
// handlers in one WorkBatch, a handler's slot is free again as soon as its
// work is done, so the end of one machine and the claim of the next share
// a transaction, and its handlers' ends are grouped. Work.FinishWith and
// CommitGroup let an application commit the results of a whole group in
// one statement.
//
// Statements run in a Tx or on DB() with parameters are kept prepared per
// pooled connection (Config.StatementCacheSize): one round trip instead of
// lib/pq's two, and a plan the server reuses.
//
// Failures back off. Work.Fail records the cause and, given a Backoff, keeps
// the (machine, process) from being claimed until an exponentially growing
// interval has passed on the database clock; Work refuses machines in
// backoff whatever the application's retrieval returned, and a later Finish
// clears the backoff. Every claim's life is recorded in work_history
// (Started, then Finished, Canceled, Failed or Abandoned) for operators to
// query in plain SQL.
//
// # Use
//
//	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: "installer"})
//	sess, err := conn.StartSession(ctx)
//	defer sess.Close(context.Background())
//	work, err := sess.Work(ctx, "install-os", func(tx *bmdb.Tx) ([]uuid.UUID, error) {
//		return myqueries.New(tx.DBTX()).MachinesNeedingOS(ctx, 10)
//	})
//	// ... install the OS, under sess.Context() ...
//	err = work.Finish(ctx, func(tx *bmdb.Tx) error {
//		return myqueries.New(tx.DBTX()).TagOSInstalled(ctx, work.Machine())
//	})
//
// Open migrates the schema (embedded from package migrations) unless
// Config.SkipMigrations is set, and refuses a schema newer than the binary.
package bmdb
