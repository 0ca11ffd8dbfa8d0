package dbconn

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

	"github.com/bmdb-dev/bmdb/internal/crdbmode"
)

// Faults injects, in cockroach mode (package crdbmode), the errors
// CockroachDB returns where PostgreSQL would not: a serialization failure
// (40001) on any statement of a transaction and at RELEASE SAVEPOINT, and
// at the commit point a 40003 (statement completion unknown) or a lost
// connection, after the commit took effect or before. A nil *Faults
// injects nothing. Safe for concurrent use, except Hook.
type Faults struct {
	retryRate, ambiguousRate float64
	closedTS                 time.Duration // 0: no refresh failures

	mu  sync.Mutex
	rng *rand.Rand
	// poked is when a heartbeat last wrote each session's row, by id
	// (under mu).
	poked map[string]time.Time

	// off, when set (tests that count retries), stops injecting.
	off atomic.Bool
	// nextCommit, when not CommitAsIs (tests), is the fate of the next
	// COMMIT.
	nextCommit atomic.Int32

	// hook, if set (tests), runs before every statement inside a
	// transaction; a non-nil error fails the statement unsent.
	hook func(query string) error

	// readWaits makes the session check wait for a writer of the session
	// row, as CockroachDB's plain read waits for an intent (waitForWriters).
	readWaits bool

	// split runs a multi-statement Exec outside a transaction one
	// statement at a time, as CockroachDB 25.x applies a migration file
	// (autocommit_before_ddl); failAfter, when positive, fails the next
	// such Exec after that many statements, once.
	split     bool
	failAfter atomic.Int32
}

// NewMigrationFaults returns the injector of a migration pool in
// cockroach mode (nil when s is off): no injected errors in transactions,
// but migration files applied one statement at a time, and failing
// between two when s.MigrationFailAfter asks for it.
func NewMigrationFaults(s crdbmode.Settings) *Faults {
	if !s.Enabled {
		return nil
	}
	f := &Faults{rng: rand.New(rand.NewPCG(s.Seed, 0xb3db)), poked: map[string]time.Time{}, split: true}
	f.failAfter.Store(int32(s.MigrationFailAfter))
	return f
}

// splits reports whether f runs multi-statement Execs one statement at a
// time.
func (f *Faults) splits() bool { return f != nil && f.split }

// execSplit runs the statements of query one by one, each committed on
// its own (outside a transaction), and fails between two of them if
// failAfter says so. A query of one statement runs as it is.
func (c *conn) execSplit(ctx context.Context, query string) (driver.Result, error) {
	stmts := splitStatements(query)
	for i, st := range stmts {
		if n := c.faults.failAfter.Load(); len(stmts) > 1 && int(n) == i && n > 0 && c.faults.failAfter.CompareAndSwap(n, 0) {
			crdbmode.InjectedMigrationFailures.Add(1)
			return nil, injected(codeSchemaChangeAborted, fmt.Sprintf(
				"migration stopped after %d of its %d statements, which stay applied (injected)", i, len(stmts)))
		}
		stop := c.nc.watch(ctx)
		_, err := c.pq.ExecContext(never, st, nil)
		stop()
		if err != nil {
			return nil, c.err(err)
		}
	}
	return driver.RowsAffected(0), nil
}

// codeSchemaChangeAborted is CockroachDB's "transaction committed but
// schema change aborted" (XXA00).
const codeSchemaChangeAborted = "XXA00"

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

// NewFaults returns the injector for s, or nil when s injects nothing.
func NewFaults(s crdbmode.Settings) *Faults {
	if !s.Enabled {
		return nil
	}
	seed := s.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &Faults{
		retryRate: s.RetryRate, ambiguousRate: s.AmbiguousRate, closedTS: s.ClosedTimestampTarget(),
		rng: rand.New(rand.NewPCG(seed, 0xb3db)), poked: map[string]time.Time{}, readWaits: true,
	}
}

func (f *Faults) roll(p float64) bool {
	if p <= 0 || f.off.Load() {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.Float64() < p
}

// Off stops f injecting anything (tests that count retries).
func (f *Faults) Off() { f.off.Store(true) }

// NextCommit sets the fate of the next COMMIT (tests).
func (f *Faults) NextCommit(fate CommitFate) { f.nextCommit.Store(int32(fate)) }

// Hook sets a function run before every statement inside a transaction; a
// non-nil error fails the statement unsent (tests). Set it before the
// Connection is used: it is not synchronised.
func (f *Faults) Hook(fn func(query string) error) { f.hook = fn }

// Statements crdb.ExecuteInTx runs around a transaction's callback.
const (
	sqlSavepoint = "SAVEPOINT cockroach_restart"
	// SQLRelease is CockroachDB's commit point in crdb.ExecuteInTx.
	SQLRelease = "RELEASE SAVEPOINT cockroach_restart"
	sqlRestart = "ROLLBACK TO SAVEPOINT cockroach_restart"
)

// Statements whose session id argument the refresh emulation follows:
// sqlc's name comment starts each.
const (
	sessionReadPrefix  = "-- name: SessionCheck"   // SessionCheck, SessionCheckBeforeCommit
	sessionWritePrefix = "-- name: SessionPoke :"  // the heartbeat
	sessionCheckPrefix = "-- name: SessionCheck :" // the first check
)

// begin notes the start of a transaction on c: its read timestamp, on
// CockroachDB.
func (f *Faults) begin(c *conn) {
	if f != nil {
		c.txStart, c.txReads = time.Now(), nil
	}
}

// statement returns the error to inject instead of running query on c, or
// nil to run it. Only statements inside transactions fail, and never
// crdb's SAVEPOINT or ROLLBACK TO SAVEPOINT.
func (f *Faults) statement(ctx context.Context, c *conn, query string, args []driver.NamedValue) error {
	if f == nil || !c.inTx {
		return nil
	}
	if f.hook != nil {
		if err := f.hook(query); err != nil {
			return err
		}
	}
	q := strings.TrimSpace(query)
	switch {
	case q == sqlRestart: // a new epoch reads at a new timestamp
		f.begin(c)
		return nil
	case q == sqlSavepoint:
		return nil
	case strings.HasPrefix(q, sessionReadPrefix):
		c.txReads = append(c.txReads, stringArgs(args)...)
		if f.readWaits && strings.HasPrefix(q, sessionCheckPrefix) {
			for _, id := range stringArgs(args) {
				if err := c.waitForWriters(ctx, id); err != nil {
					return err
				}
			}
		}
	case strings.HasPrefix(q, sessionWritePrefix):
		f.mu.Lock()
		for _, id := range stringArgs(args) {
			f.poked[id] = time.Now()
		}
		f.mu.Unlock()
	case q == SQLRelease:
		if err := f.refresh(c); err != nil {
			return err
		}
	}
	if q == SQLRelease && f.roll(f.ambiguousRate/2) {
		// The commit point on CockroachDB; not sent, so nothing committed.
		crdbmode.InjectedAmbiguous.Add(1)
		return injected(CodeStatementCompletionUnknown, "result is ambiguous (injected at RELEASE, not committed)")
	}
	if f.roll(f.retryRate) {
		crdbmode.InjectedRetryable.Add(1)
		return injected(CodeSerializationFailure, "restart transaction: TransactionRetryWithProtoRefreshError (injected)")
	}
	return nil
}

// refresh emulates CockroachDB's read refresh at the commit point of c's
// transaction: one that began longer than the closed timestamp ago has its
// commit timestamp pushed to the present, and must show that nothing it
// read was written since it began. If a heartbeat rewrote a session row it
// read, the refresh fails: 40001, on every attempt that lasts as long.
func (f *Faults) refresh(c *conn) error {
	if f.closedTS <= 0 || time.Since(c.txStart) <= f.closedTS {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range c.txReads {
		if f.poked[id].After(c.txStart) {
			crdbmode.InjectedRefresh.Add(1)
			return injected(CodeSerializationFailure, fmt.Sprintf(
				"restart transaction: TransactionRetryWithProtoRefreshError: RETRY_SERIALIZABLE - failed preemptive refresh due to a conflict on session %s (emulated: transaction older than the closed timestamp, %v)", id, f.closedTS))
		}
	}
	return nil
}

// Reads that wait. On CockroachDB a plain read that meets another
// transaction's uncommitted write of the row (an intent) waits for that
// transaction, bounded by lock_timeout (then 55P03); PostgreSQL reads the
// last committed version without waiting. The read that matters to bmdb is
// the session check: on CockroachDB it waits for an in-flight heartbeat of
// its session (an UPDATE of the row) and for a takeover or GC deleting it.
// In cockroach mode the check therefore first takes a FOR SHARE lock on
// the row inside a savepoint, which waits for any writer as CockroachDB's
// read does and fails the same way at lock_timeout, and rolls back to the
// savepoint, which releases the lock at once: nobody waits for the check.

// waitForWriters waits, inside c's transaction, until no other transaction
// holds a write on session id's row, bounded by lock_timeout and ctx.
func (c *conn) waitForWriters(ctx context.Context, id string) error {
	u, err := uuid.Parse(id)
	if err != nil {
		return nil // not a session id: nothing to wait for
	}
	// One round trip; the id is a parsed UUID, never caller text.
	query := "SAVEPOINT bmdb_read_wait; SELECT 1 FROM sessions WHERE session_id = '" + u.String() +
		"' FOR SHARE; ROLLBACK TO SAVEPOINT bmdb_read_wait; RELEASE SAVEPOINT bmdb_read_wait"
	stop := c.nc.watch(ctx)
	defer stop()
	if _, err := c.pq.ExecContext(never, query, nil); err != nil {
		_, _ = c.pq.ExecContext(never, "ROLLBACK TO SAVEPOINT bmdb_read_wait", nil)
		if SQLState(err) == CodeLockNotAvailable {
			crdbmode.InjectedReadWaits.Add(1)
		}
		return c.err(err)
	}
	return nil
}

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

// errInjectedConnLoss is the cause of a connection cut by the injector.
var errInjectedConnLoss = errors.New("bmdb: connection lost (injected at COMMIT)")

// CommitFate is what the injector does with a COMMIT (Faults.NextCommit).
type CommitFate int32

// Fates of a COMMIT.
const (
	CommitAsIs        CommitFate = iota // commit, report the outcome
	CommitThen40003                     // commit, report 40003
	RollbackThen40003                   // roll back, report 40003
	CommitThenLost                      // commit, cut the connection
	RollbackThenLost                    // cut the connection uncommitted
)

// commit decides whether t's COMMIT on c fails. If handled, err is the
// commit's result and t has ended: either committed or rolled back, and
// the caller cannot tell which.
func (f *Faults) commit(c *conn, t driver.Tx) (handled bool, err error) {
	if f == nil {
		return false, nil
	}
	var committed, lost bool
	switch fate := CommitFate(f.nextCommit.Swap(int32(CommitAsIs))); {
	case fate != CommitAsIs:
		committed = fate == CommitThen40003 || fate == CommitThenLost
		lost = fate == CommitThenLost || fate == RollbackThenLost
	case !f.roll(f.ambiguousRate):
		return false, nil
	default:
		f.mu.Lock()
		committed, lost = f.rng.IntN(2) == 0, f.rng.IntN(2) == 0
		f.mu.Unlock()
	}
	if committed {
		if err := t.Commit(); err != nil {
			return true, c.err(err)
		}
	} else if !lost {
		_ = t.Rollback()
	}
	if lost {
		crdbmode.InjectedConnLoss.Add(1)
		c.nc.cut(errInjectedConnLoss)
		return true, &AbandonedError{Cause: errInjectedConnLoss, Err: io.ErrUnexpectedEOF}
	}
	crdbmode.InjectedAmbiguous.Add(1)
	return true, injected(CodeStatementCompletionUnknown, fmt.Sprintf("result is ambiguous (injected at COMMIT, committed: %v)", committed))
}

func injected(code, msg string) error {
	return &pq.Error{Severity: "ERROR", Code: pqerror.Code(code), Message: msg}
}
