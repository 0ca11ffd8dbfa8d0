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
// session has expired blocks nobody: the next Work takes it over in the same
// transaction and records it as Abandoned. Expired sessions are deleted by
// garbage collection that every live session runs periodically.
//
// Every transaction re-checks its session. Session.Transact, Work, and the
// Work's Finish, Cancel and Fail run in SERIALIZABLE transactions whose first
// statement checks deadline > now(); Finish, Cancel and Fail also delete
// their claim only if this session still holds it. So a worker that was
// partitioned, stalled or killed commits nothing after it lost its claim:
// a takeover and a late Finish conflict, and only one of them commits.
//
// Transactions are retried on serialization failures (SQLSTATE 40001):
// on CockroachDB by crdb.ExecuteTx's savepoint restart, on PostgreSQL by
// running the whole transaction again, after a jittered capped wait. Every
// callback may therefore run several times; it must touch nothing outside
// the database and wrap errors with %w.
//
// Claims scale by batches. On PostgreSQL, SERIALIZABLE tracks reads of the
// small, hot work index per page, so concurrent claim transactions abort
// each other whatever machines they touch; a Connection therefore runs its
// claim transactions one at a time (Config.ClaimConcurrency, ends of claims
// first), and Session.WorkBatch and Session.FinishAll claim and finish many
// machines per transaction.
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
