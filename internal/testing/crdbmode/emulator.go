package crdbmode

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/google/uuid"
	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
)

// Emulator stands in for CockroachDB in front of a PostgreSQL server: a
// driver.Connector wrapper (Wrap, for bmdb.Config.WrapConnector) under
// bmdb's own driver wrapper, so that bmdb detects CockroachDB and takes its
// code paths, and meets what CockroachDB does where PostgreSQL would not:
//
//   - SELECT version() says CockroachDB; CockroachDB's session settings
//     are PostgreSQL placeholders (crdb.<name>), which keep any value an
//     operator set for a role or database; its own DDL (the spread key
//     of work_history) is taken and answered as applied.
//   - RELEASE SAVEPOINT cockroach_restart commits, as CockroachDB's commit
//     point does, and COMMIT afterwards commits nothing; ROLLBACK TO
//     SAVEPOINT cockroach_restart restarts the transaction with a new
//     snapshot, as CockroachDB's restart reads at a new timestamp (a
//     restart inside a PostgreSQL transaction would keep its snapshot and
//     fail again); a serialization failure of the commit restarts it too.
//   - Injected errors, in bmdb's transactions (those that run one of its
//     statements, through crdb, which retries as CockroachDB's clients
//     must; not golang-migrate's, for one): 40001 on statements and at
//     RELEASE (Settings.RetryRate), an ambiguous commit point, 40003 or a
//     lost connection, committed or not (Settings.AmbiguousRate,
//     NextCommit), a failed read refresh of a transaction older than the
//     closed timestamp whose session row a heartbeat rewrote before its
//     push (40001 at RELEASE), and session checks that wait for a writer
//     of the session row, bounded by lock_timeout, as a plain read waits
//     for an intent.
//   - Plain reads of bmdb's transactions wait for exclusive locks and
//     writes of the rows they read, bounded by lock_timeout (waitForLocks).
//   - A transaction's own idle_in_transaction_session_timeout
//     (set_config(..., true)) changes nothing (localIdleTimeout).
//   - Migrations as the emulated version runs them (ddl.go): a script of
//     several statements outside a transaction is one transaction that
//     refuses what CockroachDB refuses in one, or, with
//     autocommit_before_ddl on, one commit per statement; CockroachDB's
//     CREATE TYPE IF NOT EXISTS; SET autocommit_before_ddl where the
//     version has it; a migration failing between two statements when
//     Settings.MigrationFailAfter asks.
//
// One Emulator serves a Connection's pools. It is safe for concurrent use; Hook must be
// set before the pool is used.
type Emulator struct {
	s      Settings
	counts *Counts // shared with others, for a report
	own    Counts  // this Emulator's: Injected

	mu    sync.Mutex
	rng   *rand.Rand             // guarded by mu
	beats map[string][]time.Time // guarded by mu: when heartbeats wrote each session's row, within beatMemory

	off        atomic.Bool  // stops injecting (tests that count retries)
	nextCommit atomic.Int32 // the fate of the next commit point (tests); CommitAsIs: chance
	failAfter  atomic.Int32 // fails the next migration file after that many statements, once
	hook       func(query string) error
	slow       map[string]time.Duration // per element of a statement's array argument, by sqlc name (Slow)
}

// New returns an Emulator with s's injections, counting them in counts
// (nil: not counted).
func New(s Settings, counts *Counts) *Emulator {
	if counts == nil {
		counts = &Counts{}
	}
	seed := s.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	e := &Emulator{s: s, counts: counts, rng: rand.New(rand.NewPCG(seed, 0xb3db)), beats: map[string][]time.Time{}}
	e.failAfter.Store(int32(s.MigrationFailAfter))
	return e
}

// Wrap returns inner, a lib/pq connector (bmdb.Config.WrapConnector gets
// one), behind the emulation.
func (e *Emulator) Wrap(inner driver.Connector) driver.Connector {
	return &connector{e: e, inner: inner}
}

// Injected returns what e has injected so far.
func (e *Emulator) Injected() *Counts { return &e.own }

// count adds one injection of kind to e's counts and the shared ones.
func (e *Emulator) count(kind Kind) {
	e.own.n[kind].Add(1)
	e.counts.n[kind].Add(1)
}

// Off stops e injecting errors (tests that count retries); the rest of the
// emulation goes on.
func (e *Emulator) Off() { e.off.Store(true) }

// NextCommit sets the fate of the next commit point.
func (e *Emulator) NextCommit(fate CommitFate) { e.nextCommit.Store(int32(fate)) }

// Hook sets a function run before every statement inside a transaction; a
// non-nil error fails the statement unsent. Set it before the pool is
// used: it is not synchronised.
func (e *Emulator) Hook(fn func(query string) error) { e.hook = fn }

// Slow makes every statement named name (its sqlc name, as in "--
// name: WorkAbandonOfSessions") take perElement longer for each element
// of its first array argument, as a statement whose cost grows with its
// input does on a loaded cluster: tests of work that must progress within
// a budget however slow the server. Set it before the pool is used: it is
// not synchronised.
func (e *Emulator) Slow(name string, perElement time.Duration) {
	if e.slow == nil {
		e.slow = map[string]time.Duration{}
	}
	e.slow["-- name: "+name+" "] = perElement
}

// delay sleeps as Slow asks for q with args, bounded by ctx.
func (e *Emulator) delay(ctx context.Context, q string, args []driver.NamedValue) error {
	for prefix, per := range e.slow {
		if !strings.HasPrefix(q, prefix) {
			continue
		}
		for _, a := range args {
			if v, ok := a.Value.(string); ok && strings.HasPrefix(v, "{") {
				n := strings.Count(v, ",") + 1
				if v == "{}" {
					n = 0
				}
				t := time.NewTimer(time.Duration(n) * per)
				defer t.Stop()
				select {
				case <-t.C:
				case <-ctx.Done():
					return ctx.Err()
				}
				break
			}
		}
	}
	return nil
}

// CommitFate is what the emulator does at a transaction's commit point.
type CommitFate int32

// Fates of a commit point.
const (
	CommitAsIs        CommitFate = iota // commit, report the outcome
	CommitThen40003                     // commit, report 40003
	RollbackThen40003                   // roll back, report 40003
	CommitThenLost                      // commit, lose the connection
	RollbackThenLost                    // lose the connection uncommitted
)

func (e *Emulator) roll(p float64) bool {
	if p <= 0 || e.off.Load() {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rng.Float64() < p
}

// pqConn is what bmdb's driver wrapper uses of a lib/pq connection.
type pqConn = dbconn.PQConn

type connector struct {
	e     *Emulator
	inner driver.Connector
}

func (c *connector) Driver() driver.Driver { return c.inner.Driver() }

func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	raw, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	pc, ok := raw.(pqConn)
	if !ok {
		raw.Close()
		return nil, errors.New("crdbmode: the wrapped connector is not lib/pq's")
	}
	return &conn{e: c.e, pq: pc}, nil
}

// conn is one emulated connection. database/sql serialises its calls.
type conn struct {
	e    *Emulator
	pq   pqConn
	tx   *tx // the transaction in progress, nil outside one
	lost bool
	ddl  ddlState // the migration emulation's (ddl.go)
}

// CockroachDB's statements of bmdb's GC listing (bmdb/gc.go).
const (
	sqlFollowerRead   = "SET TRANSACTION AS OF SYSTEM TIME follower_read_timestamp()"
	sqlAllowFullScans = "SET LOCAL disallow_full_table_scans = off"
)

// Statements crdb.ExecuteInTx runs around a transaction's callback.
const (
	sqlSavepoint = "SAVEPOINT cockroach_restart"
	sqlRelease   = "RELEASE SAVEPOINT cockroach_restart"
	sqlRestart   = "ROLLBACK TO SAVEPOINT cockroach_restart"
)

// Statements the emulation follows, by the sqlc name comment that starts
// each of bmdb's: the reads and the write of a session's row.
var (
	sessionReads = []string{"-- name: SessionCheck", "-- name: WorkClaimMany ", "-- name: WorkFinishMany "}   // their session id arguments are read
	sessionWaits = []string{"-- name: SessionCheck :", "-- name: WorkClaimMany ", "-- name: WorkFinishMany "} // reads that wait for a writer
	sessionWrite = "-- name: SessionHeartbeat :"                                                              // the heartbeat
)

// Answers the emulation gives in CockroachDB's stead.
const (
	versionQuery        = "SELECT version()"
	versionAnswerFormat = "CockroachDB CCL v%s.0 (emulated by bmdb's cockroach mode on PostgreSQL)"
	// The spread key of work_history (bmdb's migrations on CockroachDB):
	// its check answers in place, its DDL is taken and does nothing.
	spreadCheckMark = "unordered_unique_rowid"
)

// settingNames are CockroachDB's session settings bmdb reads and pins,
// which PostgreSQL stands for with placeholders of the same name under
// placeholderPrefix.
var settingNames = map[string]bool{
	"enable_shared_locking_for_serializable":  true,
	"enable_durable_locking_for_serializable": true,
	"optimizer_use_lock_op_for_serializable":  true,
	"autocommit_before_ddl":                   true,
}

const placeholderPrefix = "crdb."

func (c *conn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := c.pq.PrepareContext(ctx, c.e.rewrite(query))
	if err != nil {
		return nil, err
	}
	return &stmt{c: c, pq: st, query: query}, nil
}

func (c *conn) Close() error { return c.pq.Close() }

func (c *conn) Begin() (driver.Tx, error) { return c.BeginTx(context.Background(), driver.TxOptions{}) }

// BeginTx begins a transaction. lib/pq watches the context of BeginTx
// until its own Commit or Rollback, and when it ends marks the connection
// bad and sends a cancel request for whatever the connection runs then.
// The emulation often ends the transaction itself (at RELEASE, or at a
// restart) and then skips lib/pq's Commit, so that watch would outlive
// the transaction: a context ended after COMMIT (a batch's, once it has
// replied) would break the connection under a later transaction, or
// cancel one of its statements. So lib/pq is handed a context that never
// ends, as bmdb's own driver wrapper does (dbconn); database/sql still
// rolls back, and discards the connection of, a transaction whose context
// ends, and each statement's own context bounds it.
func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	t, err := c.pq.BeginTx(context.WithoutCancel(ctx), opts)
	if err != nil {
		return nil, err
	}
	c.tx = &tx{c: c, pq: t, opts: opts, start: time.Now(), open: true}
	return c.tx, nil
}

func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if done, res, err := c.intercept(ctx, query, args); done {
		return res, err
	}
	query, args = placeholders(c.e.rewrite(query), args)
	return c.pq.ExecContext(ctx, query, args)
}

func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if answer, ok := c.e.canned(query); ok {
		return answer, nil
	}
	if done, _, err := c.intercept(ctx, query, args); done {
		if err == nil {
			err = fmt.Errorf("crdbmode: %q answers no rows", query)
		}
		return nil, err
	}
	query, args = placeholders(c.e.rewrite(query), args)
	return c.pq.QueryContext(ctx, query, args)
}

func (c *conn) Ping(ctx context.Context) error { return c.pq.Ping(ctx) }

func (c *conn) ResetSession(ctx context.Context) error {
	if c.lost {
		return driver.ErrBadConn
	}
	return c.pq.ResetSession(ctx)
}

func (c *conn) IsValid() bool { return !c.lost && c.pq.IsValid() }

func (c *conn) CheckNamedValue(nv *driver.NamedValue) error { return c.pq.CheckNamedValue(nv) }

// intercept handles what the emulation does instead of running query, or
// before it: done reports that it handled query (res and err are its
// outcome); otherwise query is to run as it is.
func (c *conn) intercept(ctx context.Context, query string, args []driver.NamedValue) (done bool, res driver.Result, err error) {
	q := strings.TrimSpace(query)
	if done, err := c.setSession(ctx, q); done {
		return true, driver.RowsAffected(0), err
	}
	if c.e.s.DisallowFullTableScans && strings.HasPrefix(q, "-- name: ") {
		rq, rargs := placeholders(c.e.rewrite(query), args)
		if err := c.checkFullScans(ctx, rq, rargs); err != nil {
			return true, nil, err
		}
	}
	if c.tx == nil {
		switch {
		case strings.Contains(q, spreadCheckMark):
			return true, driver.RowsAffected(0), nil
		case len(args) == 0:
			if done, err := c.script(ctx, q); done {
				return true, driver.RowsAffected(0), err
			}
		}
		return false, nil, nil
	}
	c.noteVersionMark(q, args)
	switch q {
	case sqlFollowerRead:
		// A read at follower_read_timestamp(): PostgreSQL reads the
		// present, which a read a few seconds old differs from only in
		// what it sees of the last seconds' writes.
		return true, driver.RowsAffected(0), nil
	case sqlAllowFullScans:
		_, err := c.pq.ExecContext(ctx, "SET LOCAL "+placeholderPrefix+"disallow_full_table_scans = off", nil)
		c.tx.fullScansAllowed = err == nil
		return true, driver.RowsAffected(0), err
	case sqlSavepoint:
		c.tx.crdb = true
		return false, nil, nil
	case sqlRestart:
		return true, driver.RowsAffected(0), c.tx.restart(ctx)
	case sqlRelease:
		return true, driver.RowsAffected(0), c.tx.release(ctx)
	}
	if err := c.statement(ctx, q, args); err != nil {
		return true, nil, err
	}
	return false, nil, nil
}

// statement returns the error to inject instead of running query inside
// the transaction, or nil to run it, after following what it reads and
// writes of session rows, and waiting for a writer of those it checks.
func (c *conn) statement(ctx context.Context, q string, args []driver.NamedValue) error {
	e := c.e
	if e.hook != nil {
		if err := e.hook(q); err != nil {
			return err
		}
	}
	if err := e.delay(ctx, q, args); err != nil {
		return err
	}
	c.tx.bmdb = c.tx.bmdb || strings.HasPrefix(q, "-- name: ")
	for _, p := range sessionReads {
		if strings.HasPrefix(q, p) {
			c.tx.reads = append(c.tx.reads, stringArgs(args)...)
		}
	}
	for _, p := range sessionWaits {
		if strings.HasPrefix(q, p) {
			for _, id := range stringArgs(args) {
				if err := c.waitForWriters(ctx, id); err != nil {
					return err
				}
			}
		}
	}
	if plain := sharedLocks(q); c.tx.crdb && plainRead(plain) {
		if err := c.waitForLocks(ctx, plain, args); err != nil {
			return err
		}
	}
	if c.tx.crdb {
		if err := c.lockAtFetch(ctx, q, args); err != nil {
			return err
		}
	}
	if strings.HasPrefix(q, sessionWrite) {
		e.mu.Lock()
		for _, id := range stringArgs(args) {
			e.beats[id] = remember(e.beats[id], time.Now())
		}
		e.mu.Unlock()
	}
	if c.tx.crdb && c.tx.bmdb && e.roll(e.s.RetryRate) {
		e.count(Retryable)
		return injected(codeSerializationFailure, "restart transaction: TransactionRetryWithProtoRefreshError (injected)")
	}
	return nil
}

// placeholders rewrites CockroachDB's setting names among a settings
// statement's arguments to PostgreSQL's placeholders for them; a
// placeholder that is not set reads as empty, where PostgreSQL would fail.
func placeholders(query string, args []driver.NamedValue) (string, []driver.NamedValue) {
	if !strings.Contains(query, "current_setting(") && !strings.Contains(query, "set_config(") {
		return query, args
	}
	var out []driver.NamedValue // a copy, made at the first rewrite
	for i, a := range args {
		if s, ok := a.Value.(string); ok && settingNames[s] {
			if out == nil {
				out = append(out, args...)
			}
			out[i].Value = placeholderPrefix + s
		}
	}
	if out == nil {
		return query, args
	}
	return strings.ReplaceAll(query, "current_setting($1)", "current_setting($1, true)"), out
}

// A transaction's own idle timeout. bmdb's last check before COMMIT lowers
// idle_in_transaction_session_timeout for the rest of its transaction
// (set_config(..., true)). On PostgreSQL the wait that follows uses it; on
// CockroachDB that the value set inside a transaction changes the wait
// already under way is not confirmed, and bmdb does not rely on it there.
// The emulation takes the worst case: the setting goes to a placeholder
// and changes nothing, so a stalled transaction is ended by the
// connection's own timeout.
var localIdleTimeoutCall = regexp.MustCompile(`(?s)set_config\('idle_in_transaction_session_timeout',(.*?),\s*true\)`)

// localIdleTimeout rewrites query's transaction-local settings of the idle
// timeout to the placeholder's.
func localIdleTimeout(query string) string {
	if !strings.Contains(query, "idle_in_transaction_session_timeout") {
		return query
	}
	return localIdleTimeoutCall.ReplaceAllString(query, "set_config('"+placeholderPrefix+"idle_in_transaction_session_timeout',$1, true)")
}

// Reads that wait. On CockroachDB a plain read that meets another
// transaction's uncommitted write of the row (an intent) waits for that
// transaction, bounded by lock_timeout (then 55P03); PostgreSQL reads the
// last committed version without waiting. The reads that matter to bmdb
// are its session checks: they wait for an in-flight heartbeat of the
// session (an UPDATE of the row) and for a takeover or GC deleting it. So
// a check first takes a FOR SHARE lock on the row inside a savepoint,
// which waits for any writer as CockroachDB's read does and fails the same
// way at lock_timeout, and rolls back to the savepoint, which releases the
// lock at once: nobody waits for the check.

// waitForWriters waits, inside c's transaction, until no other transaction
// holds a write on session id's row, bounded by lock_timeout.
func (c *conn) waitForWriters(ctx context.Context, id string) error {
	u, err := uuid.Parse(id)
	if err != nil {
		return nil // not a session id: nothing to wait for
	}
	// One round trip; the id is a parsed UUID, never caller text.
	query := "SAVEPOINT bmdb_read_wait; SELECT 1 FROM sessions WHERE session_id = '" + u.String() +
		"' FOR SHARE; ROLLBACK TO SAVEPOINT bmdb_read_wait; RELEASE SAVEPOINT bmdb_read_wait"
	if _, err := c.pq.ExecContext(ctx, query, nil); err != nil {
		_, _ = c.pq.ExecContext(ctx, "ROLLBACK TO SAVEPOINT bmdb_read_wait", nil)
		if sqlState(err) == codeLockNotAvailable {
			c.e.count(ReadWaits)
		}
		return err
	}
	return nil
}

// Exclusive locks block plain reads. On CockroachDB a plain read waits for
// a transaction that holds an exclusive lock (FOR UPDATE, FOR NO KEY
// UPDATE) or an intent on a row it reads
// (kv.lock.exclusive_locks_block_non_locking_reads.enabled, on by
// default); on PostgreSQL it reads the last committed version. So a plain
// SELECT of one of bmdb's transactions (a retrieval, one of bmdb's reads)
// first runs again with FOR SHARE inside a savepoint, which waits for
// such a holder as CockroachDB's read does and fails the same way at
// lock_timeout, and rolls back to the savepoint, which releases its locks
// at once. What PostgreSQL cannot lock that way is not emulated: rows of
// an outer join's nullable side, of a subquery in WHERE, of a statement
// with aggregates, DISTINCT or set operations (the FOR SHARE run fails and
// the read goes on without waiting), and rows another transaction is
// inserting, which PostgreSQL does not show. For its moment the share lock
// holds up a writer of those rows, which CockroachDB's read would not.

// lockingClause finds a statement's own locking clause.
var lockingClause = regexp.MustCompile(`(?i)\bFOR\s+(?:UPDATE|SHARE|NO\s+KEY\s+UPDATE|KEY\s+SHARE)\b`)

// plainRead reports whether q is a SELECT without a locking clause.
func plainRead(q string) bool {
	for {
		q = strings.TrimSpace(q)
		if !strings.HasPrefix(q, "--") {
			break
		}
		if i := strings.IndexByte(q, '\n'); i >= 0 {
			q = q[i+1:]
		} else {
			return false
		}
	}
	return len(q) > 6 && strings.EqualFold(q[:6], "SELECT") && unicode.IsSpace(rune(q[6])) && !lockingClause.MatchString(q)
}

// waitForLocks waits, inside c's transaction, until no other transaction
// holds an exclusive lock or a write on a row that q, a plain read, reads,
// bounded by lock_timeout.
func (c *conn) waitForLocks(ctx context.Context, q string, args []driver.NamedValue) error {
	if _, err := c.pq.ExecContext(ctx, "SAVEPOINT bmdb_lock_wait", nil); err != nil {
		return err
	}
	shared := strings.TrimRight(strings.TrimSpace(q), ";") + "\nFOR SHARE"
	rows, err := c.pq.QueryContext(ctx, shared, args)
	if err == nil {
		err = drain(rows)
	}
	_, rerr := c.pq.ExecContext(ctx, "ROLLBACK TO SAVEPOINT bmdb_lock_wait; RELEASE SAVEPOINT bmdb_lock_wait", nil)
	var pe *pq.Error
	switch {
	case err == nil:
		return rerr
	case !errors.As(err, &pe):
		return err // the connection or ctx: the read would fail too
	case pe.Code == codeLockNotAvailable:
		c.e.count(ReadWaits)
		return err
	case pe.Code == codeDeadlockDetected || pe.Code == codeQueryCanceled:
		return err
	}
	// PostgreSQL cannot lock what q reads (or the holder has committed
	// since the snapshot): nothing to wait for.
	return rerr
}

// lose closes c's connection as a network failure would, and returns the
// error its caller sees.
func (c *conn) lose() error {
	c.lost = true
	c.e.count(ConnLoss)
	_ = c.pq.Close()
	return fmt.Errorf("%w: %w", errInjectedConnLoss, io.ErrUnexpectedEOF)
}

// errInjectedConnLoss is the cause of a connection the emulation closed.
var errInjectedConnLoss = errors.New("crdbmode: connection lost (injected at the commit point)")

// tx is an emulated transaction: a PostgreSQL transaction (open while
// PostgreSQL has one in progress), restarted with a new one where
// CockroachDB restarts at a new timestamp.
type tx struct {
	c         *conn
	pq        driver.Tx
	opts      driver.TxOptions
	start     time.Time // its read timestamp: when it, or its last restart, began
	reads     []string  // the session rows it read
	open      bool      // PostgreSQL has the transaction in progress
	committed bool      // committed at RELEASE: COMMIT commits nothing
	crdb      bool      // it runs through crdb (SAVEPOINT cockroach_restart), which retries
	bmdb      bool      // it ran one of bmdb's statements (sqlc's "-- name: " comment)
	// fullScansAllowed: it ran SET LOCAL disallow_full_table_scans = off
	// (fullscan.go).
	fullScansAllowed bool
}

// begin starts a new PostgreSQL transaction with t's options and crdb's
// savepoint, in t's stead.
func (t *tx) begin(ctx context.Context) error {
	q := "BEGIN"
	switch t.opts.Isolation {
	case driver.IsolationLevel(1), driver.IsolationLevel(2): // read uncommitted, read committed
		q += " ISOLATION LEVEL READ COMMITTED"
	case driver.IsolationLevel(4), driver.IsolationLevel(5): // repeatable read, snapshot
		q += " ISOLATION LEVEL REPEATABLE READ"
	case driver.IsolationLevel(6), driver.IsolationLevel(7): // serializable, linearizable
		q += " ISOLATION LEVEL SERIALIZABLE"
	}
	if t.opts.ReadOnly {
		q += " READ ONLY"
	}
	if _, err := t.c.pq.ExecContext(ctx, q+"; "+sqlSavepoint, nil); err != nil {
		return err
	}
	t.open, t.start, t.reads = true, time.Now(), nil
	return nil
}

// restart is ROLLBACK TO SAVEPOINT cockroach_restart: the transaction runs
// again, with a new snapshot.
func (t *tx) restart(ctx context.Context) error {
	t.fullScansAllowed = false // the restart rolls back what the transaction SET LOCAL
	if t.open {
		if _, err := t.c.pq.ExecContext(ctx, "ROLLBACK", nil); err != nil {
			return err
		}
		t.open = false
	}
	return t.begin(ctx)
}

// release is RELEASE SAVEPOINT cockroach_restart, CockroachDB's commit
// point: a failed read refresh or an injected 40001 fails it with the
// transaction still open (crdb restarts it); otherwise it commits, unless
// its fate says otherwise, and a serialization failure of the commit
// leaves a new transaction in its place for crdb's restart.
func (t *tx) release(ctx context.Context) error {
	c, e := t.c, t.c.e
	if err := t.refresh(); err != nil {
		return err
	}
	if err := c.statement(ctx, sqlRelease, nil); err != nil {
		return err
	}
	fate := CommitFate(e.nextCommit.Swap(int32(CommitAsIs)))
	if fate == CommitAsIs && e.roll(e.s.AmbiguousRate) {
		e.mu.Lock()
		fate = CommitFate(1 + e.rng.IntN(4))
		e.mu.Unlock()
	}
	committed := fate != RollbackThen40003 && fate != RollbackThenLost
	if committed {
		if _, err := c.pq.ExecContext(ctx, "RELEASE SAVEPOINT cockroach_restart; COMMIT", nil); err != nil {
			t.open = false
			if sqlState(err) == codeSerializationFailure {
				if berr := t.begin(ctx); berr != nil {
					return errors.Join(err, berr)
				}
			}
			return err
		}
		t.open, t.committed = false, true
	}
	switch fate {
	case CommitAsIs:
		return nil
	case CommitThenLost, RollbackThenLost:
		t.open = false
		return c.lose()
	}
	if !committed {
		_, _ = c.pq.ExecContext(ctx, "ROLLBACK", nil)
		t.open = false
	}
	e.count(Ambiguous)
	return injected(codeStatementCompletionUnknown, fmt.Sprintf("result is ambiguous (injected at the commit point, committed: %v)", committed))
}

// refresh emulates CockroachDB's read refresh at the commit point: a
// transaction that began longer than the closed timestamp ago has its
// writes pushed to about now - closed timestamp, and must show that
// nothing it read was written between its read timestamp and that one. If
// a heartbeat rewrote a session row it read in that window, the refresh
// fails: 40001. (Every emulated transaction counts as one that writes; a
// read-only one is not pushed on CockroachDB.)
func (t *tx) refresh() error {
	e := t.c.e
	closed := e.s.ClosedTimestampTarget()
	if closed <= 0 || time.Since(t.start) <= closed {
		return nil
	}
	pushed := time.Now().Add(-closed)
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, id := range t.reads {
		for _, beat := range e.beats[id] {
			if beat.After(t.start) && !beat.After(pushed) {
				e.count(Refresh)
				return injected(codeSerializationFailure, fmt.Sprintf(
					"restart transaction: TransactionRetryWithProtoRefreshError: RETRY_SERIALIZABLE - failed preemptive refresh due to a conflict on session %s (emulated: a heartbeat between the transaction's start and its push to the closed timestamp, %v ago)", id, closed))
			}
		}
	}
	return nil
}

// beatMemory is how long the emulation remembers a heartbeat: longer than
// any transaction it pushes lives.
const beatMemory = time.Minute

// remember returns beats with now added and those older than beatMemory
// dropped.
func remember(beats []time.Time, now time.Time) []time.Time {
	keep := beats[:0]
	for _, p := range beats {
		if now.Sub(p) < beatMemory {
			keep = append(keep, p)
		}
	}
	return append(keep, now)
}

func (t *tx) Commit() error {
	defer func() { t.c.tx = nil }()
	if t.committed || !t.open {
		return nil // committed at RELEASE, or ended there
	}
	return t.pq.Commit()
}

func (t *tx) Rollback() error {
	defer func() { t.c.tx = nil }()
	if !t.open {
		return nil
	}
	if t.c.lost {
		return driver.ErrBadConn
	}
	return t.pq.Rollback()
}

// stmt is a prepared statement of an emulated connection.
type stmt struct {
	c     *conn
	pq    driver.Stmt
	query string
}

func (s *stmt) Close() error  { return s.pq.Close() }
func (s *stmt) NumInput() int { return s.pq.NumInput() }

func (s *stmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.ExecContext(context.Background(), namedValues(args))
}

func (s *stmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.QueryContext(context.Background(), namedValues(args))
}

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if done, res, err := s.c.intercept(ctx, s.query, args); done {
		return res, err
	}
	return s.pq.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if answer, ok := s.c.e.canned(s.query); ok {
		return answer, nil
	}
	if done, _, err := s.c.intercept(ctx, s.query, args); done {
		if err == nil {
			err = fmt.Errorf("crdbmode: %q answers no rows", s.query)
		}
		return nil, err
	}
	return s.pq.(driver.StmtQueryContext).QueryContext(ctx, args)
}

func namedValues(args []driver.Value) []driver.NamedValue {
	nv := make([]driver.NamedValue, len(args))
	for i, v := range args {
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return nv
}

// canned returns the emulation's answer to query, if it answers it.
func (e *Emulator) canned(query string) (driver.Rows, bool) {
	q := strings.TrimSpace(query)
	switch {
	case q == versionQuery:
		return &oneValue{column: "version", value: fmt.Sprintf(versionAnswerFormat, e.s.Version)}, true
	case strings.Contains(q, spreadCheckMark) && strings.Contains(q, "information_schema.columns"):
		return &oneValue{column: "count", value: int64(1)}, true
	case q == "SHOW CLUSTER SETTING kv.closed_timestamp.target_duration":
		return &oneValue{column: "kv.closed_timestamp.target_duration", value: e.s.ClosedTimestampTarget().String()}, true
	case q == "SHOW CLUSTER SETTING kv.lock.exclusive_locks_block_non_locking_reads.enabled":
		return &oneValue{column: "kv.lock.exclusive_locks_block_non_locking_reads.enabled", value: "true"}, true
	}
	return nil, false
}

// oneValue is a result of one row of one column.
type oneValue struct {
	column string
	value  driver.Value
	done   bool
}

func (r *oneValue) Columns() []string { return []string{r.column} }
func (r *oneValue) Close() error      { return nil }
func (r *oneValue) Next(dest []driver.Value) error {
	if r.done {
		return io.EOF
	}
	r.done, dest[0] = true, r.value
	return nil
}

// splitStatements splits a script at the semicolons that end its
// statements, not those inside comments, quotes or dollar quotes, and
// drops what holds no statement (whitespace and comments only).
func splitStatements(script string) []string {
	var stmts []string
	start, code := 0, false // code: the current piece has more than comments
	flush := func(end int) {
		if code {
			stmts = append(stmts, strings.TrimSpace(script[start:end]))
		}
		start, code = end+1, false
	}
	for i := 0; i < len(script); i++ {
		switch ch := script[i]; {
		case strings.HasPrefix(script[i:], "--"):
			if j := strings.IndexByte(script[i:], '\n'); j >= 0 {
				i += j
			} else {
				i = len(script)
			}
		case strings.HasPrefix(script[i:], "/*"):
			if j := strings.Index(script[i+2:], "*/"); j >= 0 {
				i += j + 3
			} else {
				i = len(script)
			}
		case ch == '\'' || ch == '"':
			code = true
			if j := strings.IndexByte(script[i+1:], ch); j >= 0 {
				i += j + 1 // a doubled quote reads as two quoted pieces
			} else {
				i = len(script)
			}
		case ch == '$':
			code = true
			if tag := dollarTag.FindString(script[i:]); tag != "" {
				if j := strings.Index(script[i+len(tag):], tag); j >= 0 {
					i += len(tag) + j + len(tag) - 1
				} else {
					i = len(script)
				}
			}
		case ch == ';':
			flush(i)
		case !unicode.IsSpace(rune(ch)):
			code = true
		}
	}
	flush(len(script))
	return stmts
}

// dollarTag matches the opening of a dollar-quoted string: $$ or $tag$.
var dollarTag = regexp.MustCompile(`^\$[A-Za-z_]*\$`)

// stringArgs returns the text arguments of a statement (uuid.UUID arrives
// as text).
func stringArgs(args []driver.NamedValue) []string {
	var out []string
	for _, a := range args {
		switch v := a.Value.(type) {
		case string:
			out = append(out, v)
		case []byte:
			out = append(out, string(v))
		}
	}
	return out
}

// SQLSTATEs the emulation injects or reacts to.
const (
	codeSerializationFailure       = "40001"
	codeStatementCompletionUnknown = "40003"
	codeLockNotAvailable           = "55P03"
	codeDeadlockDetected           = "40P01"
	codeQueryCanceled              = "57014"
)

func injected(code, msg string) error {
	return &pq.Error{Severity: "ERROR", Code: pqerror.Code(code), Message: msg}
}

func sqlState(err error) string {
	var pe *pq.Error
	if errors.As(err, &pe) {
		return string(pe.Code)
	}
	return ""
}

// drain reads rows to their end and closes them, returning the first
// error. An error after the first row (a serialization failure of a
// locking read, a lock timeout) comes from Next, and lib/pq's Close does
// not repeat it: a caller that dropped it would leave the transaction
// aborted, and the next statement failing with 25P02.
func drain(rows driver.Rows) error {
	dest := make([]driver.Value, len(rows.Columns()))
	var err error
	for err == nil {
		err = rows.Next(dest)
	}
	if errors.Is(err, io.EOF) {
		err = nil
	}
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	return err
}
