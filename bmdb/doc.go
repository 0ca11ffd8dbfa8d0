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
// How soon a dead worker's machines are worked again: its session expires
// at its deadline on the database clock, at most one SessionInterval after
// its last successful heartbeat, and from then on its claims count for
// nothing. With the default Config and a retrieval that treats a claim of
// an expired session as none (model's MachinesWithoutWork, the README's),
// a live session of the process claims each of those machines again
// within about one SessionInterval after that deadline, on both engines,
// however many free machines wait behind them in the retrieval's order
// (oldest first in the README's: a dead worker's machines were taken
// before those that still wait): a claim statement that finds claims of
// expired sessions among its candidates takes those sessions over first
// (Abandoned, then Started with the next fencing token). A retrieval that
// skips every claim row, live or not, never offers them; for it, each
// session's claims of a process also sweep the process's expired claims
// once every quarter interval, so that they end about that soon after the
// deadline while a live session claims for the process, and retrievals
// return the machines again, in their order; garbage collection ends
// them anyway about GCGracePeriod + GCPeriod after the deadline (two
// intervals by default). Under a cap, a claim that finds no free slot takes over the
// expired sessions holding slots. Stats.ClaimsTakenOver counts the claims
// ended by takeovers; the chaos harness (cmd/bmdb-chaos) prints measured
// reclaim times (TestDeadWorkersMachinesWorkedAgainWithinAnInterval,
// TestExpiredClaimsSlotIsTakenOver).
//
// Every transaction re-checks its session. Session.Transact runs
// SERIALIZABLE transactions, and the batches of Work, WorkMany, Finish,
// Cancel and Fail run at snapshot isolation on PostgreSQL (see
// Isolation); each reads the session row and checks deadline >
// statement_timestamp() before its first write (a batch that claims does
// it in its first claim statement), and, as its last statement before
// COMMIT, checks the local deadline and the database clock again (a
// batch's last claim or Finish statement does it as it runs, when it
// comes last, after the commit callbacks; any statement after the last
// check brings the check back, by construction: docs/engine.md); Finish,
// Cancel and Fail also
// delete their claim only if this session still holds it. A takeover or
// GC deletes the superseded session's row, and that write orders it
// against every open transaction of the session, by a mechanism that
// differs by engine:
//
//   - PostgreSQL: the check locks the row FOR KEY SHARE, so the takeover's
//     delete waits for the transaction to end (or aborts it).
//   - CockroachDB: FOR KEY SHARE is a plain read under SERIALIZABLE (shared
//     locking is off by default, and bmdb pins it off: on, the heartbeat's
//     UPDATE would wait for every open transaction of its session). The
//     delete lands above the transaction's read timestamp: the transaction
//     either commits below it, serialized before the takeover, or is
//     pushed above it and fails its read refresh (40001), and its retry
//     finds no session. The heartbeat rewrites the same row, so a
//     transaction that writes when older than the closed timestamp (3 s),
//     pushed to about now - 3 s, fails its refresh if a heartbeat landed
//     in between: an attempt is bounded by Config.MaxTransactionDuration
//     (ErrTransactionTooLong; docs/cockroachdb.md).
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
// = SessionInterval, and on PostgreSQL the last check before COMMIT lowers
// the latter to the lease the session has left (on CockroachDB bmdb does
// not rely on that: docs/cockroachdb.md). A takeover (or GC) is never
// ordered after a transaction of the session it supersedes (see above): on
// PostgreSQL it waits for it, bounded by those timeouts; on CockroachDB it
// does not wait for its read, only for its writes (intents), and the
// pre-COMMIT check and the connection's idle timeout bound how long the
// stalled transaction stays open: one interval after its stall began, at
// most. One case is longer there: if the gateway node of a stalled
// transaction dies, its intents stay until CockroachDB finds its
// transaction record unheartbeated, about 5 s (kv's transaction liveness
// threshold), so a takeover of what it wrote waits up to that long whatever
// the interval. What is guaranteed (the tests named measure it; the
// figures are in their logs and bench/README.md):
//
//   - A worker's session context is cancelled no later than its deadline on
//     the database clock, on a black-holed network too
//     (TestBlackHoleEndsSessionAndCalls).
//   - No transaction of a session commits after another session took one of
//     its claims over, nor, on PostgreSQL, after the session's deadline on
//     the database clock: a transaction stopped anywhere between its first
//     check and its COMMIT, for longer than its lease, fails when it
//     resumes and none of its writes are visible
//     (TestStalledTransactionCommitsNothingAfterTakeover,
//     TestPartitionBeforeCommitFencesFinish). The only window is a COMMIT
//     that reached the server before the deadline and is still being
//     processed at it. On CockroachDB a transaction stopped after its last
//     check may still commit up to one interval after the deadline, if no
//     takeover or GC superseded its session meanwhile, or if it wrote
//     nothing a takeover meanwhile touched: it is then serialized before
//     the takeover and any later transaction, though its COMMIT came after
//     them by the clock. "After" above is the serialization order there.
//   - A takeover waits behind a stalled or partitioned holder for at most
//     about one interval after the holder's deadline, however long the
//     stall.
//   - Side effects outside the database are not fenced by the database: use
//     Work.FencingToken, which grows with every claim of a (machine,
//     process), and have the external system refuse older tokens.
//
// # Batches
//
// A session runs its claims and ends of each process in shared
// transactions, batches, on its callers' goroutines (docs/engine.md has
// the mechanism): a call that finds no batch of its process running runs
// one itself, with whatever waits, so a call alone runs its own batch;
// calls that arrive while Config.MaxConcurrentBatches batches run wait,
// and the next batch, run by one of them, takes in up to
// Config.MaxBatchSize of them (each attempt also takes in the calls that
// arrived while it began),
// with one multi-row statement per kind of end and per round of claims:
// the claims first, each request's retrieve and then its claims, right
// after the snapshot the retrievals read; then the ends; then, for claims
// that want more, the machines those ends freed. Each claim gets machines
// no other claim of the batch got. Batches form from what waits while the
// previous one runs: no timer adds latency at low load, and at high load
// one transaction serves many calls. With the default of one batch at a
// time, a slow retrieve or commit callback holds the session's other
// calls of its process until its batch ends: raise
// Config.MaxConcurrentBatches where callbacks may be slow.
//
// Each call gets its own outcome, nil only once its batch committed, and
// one call's failure is its own: a lost claim fails only its end
// (ErrWorkLost); a retrieve or commit callback that fails or panics fails
// (or panics) only its own call, on the caller's goroutine, and the rest of
// the batch runs again without it; a statement error any call may have
// caused runs each call again alone; when claims and ends run out of
// retries together, the ends run again on their own. After an ambiguous
// COMMIT the batch's claims are looked up: if any is held, the batch
// committed. A call whose ctx ends while it waits leaves without effect;
// once its batch has begun, it waits for the outcome, which the session and
// the latest deadline of the batch's calls bound. Callbacks run on the
// goroutine running the batch, which may be another caller's, so they
// must not call Work or the ends of the same session and process: they
// would wait for their own batch.
//
// Claims of different processes (sessions, connections, hosts) neither
// wait for nor abort each other unless they touch the same (machine,
// process), and nothing serializes them. Each (machine, process) has a
// claim row (work_fencing) that every claim and every end of the pair
// writes, and a claim statement locks its candidates' claim rows with
// SKIP LOCKED and claims only those it locked: a machine another
// transaction is claiming or ending for the process is skipped, not waited
// for. No retrieval, foreign key or operator's query reads that row (the
// machine's own row is not locked: on CockroachDB an exclusive lock also
// blocks plain reads). A takeover skips an expired session that another
// takeover or a GC is superseding (both lock its primary key). A call
// whose candidates were all taken returns ErrWorkConflict, which tells
// "others hold or are taking these" from ErrNothingToDo. A pair's claim
// row is made before its first claim, outside any claim transaction, so
// that no claim waits for another's insert of it: when a claim statement
// reports candidates without one, they are made in a statement of their
// own, and that batch runs again with a new snapshot.
//
// worker.Loop relies on batches: it claims for all its free handlers in
// one WorkMany, a handler's slot is free again as soon as its work is
// done, so the end of one machine and the claim of the next share a
// transaction, and its handlers' ends are batched. A SharedCommit, passed
// to Finish with CommitShared, commits the results of a batch's Works in
// one call.
//
// # Isolation
//
// Session.Transact is SERIALIZABLE on both engines. Batches are
// SERIALIZABLE on CockroachDB, whose conflicts are per key. On PostgreSQL,
// whose SERIALIZABLE tracks reads per index page, so that batches on a
// small, hot table would abort each other whatever machines they touch,
// batches run at snapshot isolation (REPEATABLE READ), unless
// Config.SerializableBatches is set. Under snapshot
// isolation every statement of a transaction reads one snapshot, and of
// two transactions that write the same row the second to commit fails
// (first committer wins). What holds by construction:
//
//   - One live claim per (machine, process): the work table's primary key.
//   - A claim of (machine, process) commits only if no claim or end of the
//     pair committed after its transaction's snapshot: every claim and
//     every end writes the pair's claim row in the transaction that
//     claims or ends, and the claim locks that row, so it fails if another
//     wrote it after the snapshot (40001). So a retrieval that read the
//     process's own state of a machine (its tags, its claims, its
//     backoffs) can never lead to processing the machine twice, even a
//     retrieval that ignores claims: the claim that would act on a
//     retrieval older than the machine's last claim or end fails, and the
//     batch runs again, at once, with a new snapshot (Stats.ClaimsStale,
//     not a transaction retry). Backoffs set by a concurrent Fail are
//     respected the same way, and the claim statement itself refuses a
//     machine in backoff.
//   - Fencing, the last check before COMMIT, ambiguous COMMITs and the
//     isolation of a failing call are as described above.
//
// What is weaker than SERIALIZABLE, on PostgreSQL only (CockroachDB's
// batches are SERIALIZABLE, which orders the two sides below; FOR SHARE
// is a plain read there, and the first remedy is not needed): write skew
// between a retrieval or a commit callback and another transaction that
// writes rows this one read but did not write, and reads what this one
// writes. Say an operator's
// tool quarantines a machine only if no process works on it, and a claim's
// retrieval skips quarantined machines: the tool may find no claim while
// the retrieval finds no quarantine, and both commit, so that a
// quarantined machine is worked on. An application protects itself by
// reading the rows it depends on FOR SHARE in the retrieval (a writer of
// them then waits for the claim, or, if it committed after the snapshot,
// the claim fails and runs again) while the other side writes before it
// looks, each statement seeing what committed before it (READ COMMITTED);
// or by setting Config.SerializableBatches, with the other side SERIALIZABLE
// too (Session.Transact is): then one of the two aborts. Either way
// processes' batches still run at once (TestWriteSkewAndItsRemedies,
// TestStaleRetrievalClaimsNothing, TestClaimsRacingEndsAndTakeovers).
//
// # Fleet controls
//
// An operator pauses a process fleet-wide (Session.PauseProcess, bmdbctl
// pause) or caps how many claims of it are live at once, on every
// component together (Session.CapProcess, bmdbctl cap). The claim
// statement enforces both, so they are exact, not polled: each process has
// a controls row that every claim of it reads, locked FOR SHARE on
// PostgreSQL, and a pause or cap change writes it. On PostgreSQL the
// change waits for the claims in flight and commits after them, and a
// claim whose snapshot is older than the change fails to lock the row
// (first committer wins: it runs again and sees the change); on
// CockroachDB the lock is a plain read and SERIALIZABLE orders each claim
// before or after the change, so a claim that read the row before the
// change may still commit after it on the wall clock: PauseProcess (and a
// new or lowered cap) returns there only once such claims can no longer
// commit (its doc says how long it waits, and the one exception, a client
// stalled before its COMMIT). So no claim of a paused process commits
// after PauseProcess returned; claims held end normally, and GC still ends an
// expired session's claims as Abandoned, but nobody claims them again
// until the resume. Under a cap of N each claim takes one of the slot
// numbers 0..N-1 that no live claim holds (a unique key on the work
// table: never more than N live claims, whatever the races; on PostgreSQL
// free slots are locked SKIP LOCKED, on CockroachDB none is locked and
// the unique key arbitrates, so claims do not wait for each other but for
// a claim of the same slot), and an end or
// an Abandoned claim frees its slot. After the cap is lowered, new claims
// wait until no live claim holds a slot at or above it. Work returns
// ErrProcessPaused or ErrCapReached then, both ErrNothingToDo to code
// that does not tell them apart. The controls row is the one row every
// claim of a process reads; claims never write it (CockroachDB: no hot
// row written per claim), and a claim locks no more slot rows than it
// claims machines (on CockroachDB, none). Changes are recorded in process_control_history,
// and the view process_status shows each process's controls and live
// claims.
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
// # Tracing
//
// With Config.TracerProvider set, a Connection starts OpenTelemetry spans
// (instrumentation scope github.com/bmdb-dev/bmdb), each a child of its
// call's context's span: bmdb.Work and bmdb.WorkMany, bmdb.Finish,
// bmdb.Cancel, bmdb.Fail and bmdb.FinishAndWork, and bmdb.Transact. A
// batch transaction has a span of its own, bmdb.batch, the root of a
// trace of its own since it carries the calls of many traces: it links to
// the span of each call it carried, and each call's span links to it
// (Work.BatchSpanContext gives a claim's, for the spans of the work done
// on the machine: worker.Loop's worker.handle links to it). Attributes:
// bmdb.process; bmdb.machine, bmdb.claim_id and bmdb.fencing_token, the
// claim's (a WorkMany adds an event bmdb.claim per claim); bmdb.attempts,
// the transaction's; bmdb.batch.size (with bmdb.batch.claims and
// bmdb.batch.ends) on a batch; and bmdb.outcome: ok, nothing_to_do,
// paused, capped and conflict, which are not errors, or lost,
// session_expired, retries_exhausted, ambiguous_commit, error and the
// like, recorded as the span's error (RecordError, status Error). Without
// a TracerProvider no span is started at all, not even a no-op one: the
// untraced path allocates nothing for tracing (TestTraceOffAllocatesNothing).
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
// Open migrates bmdb's schema and then Config.Application's with package
// migrations (its Migrator) unless Config.SkipMigrations is set, and
// refuses a schema it must not use with a *migrations.SchemaVersionError:
// one newer than the binary that does not declare it compatible, or one
// left dirty by a migration that did not finish (the error says how to
// repair it).
package bmdb
