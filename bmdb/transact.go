package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/cockroachdb/cockroach-go/v2/crdb"
	"github.com/google/uuid"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/wait"
	"github.com/bmdb-dev/bmdb/model"
)

// Tx is one attempt of a bmdb transaction. It is valid only inside the
// callback it was passed to, and not safe for concurrent use.
type Tx struct {
	tx *sql.Tx
	q  *store.Queries // bmdb's own statements, prepared
	r  *model.Queries // the read-only ones handed to callbacks
}

// newTx wraps one attempt's transaction; bmdb's statements use the
// connection's prepared statements.
func (c *Connection) newTx(tx *sql.Tx) *Tx {
	return &Tx{tx: tx, q: c.prepared.WithTx(tx), r: model.New(tx)}
}

// Queries returns bmdb's read-only queries (the operator views, a
// machine's history and backoffs, MachinesWithoutWork, ...) bound to the
// transaction. bmdb's own write statements are not among them: claims,
// ends, sessions and backoffs change only through Session and Work, which
// check and fence them. (Package model has no write statement at all;
// bmdb's are in an internal package.)
func (t *Tx) Queries() *model.Queries { return t.r }

// DBTX returns the transaction as the interface sqlc generates for
// database/sql, so that an application passes it to its own sqlc package's
// New and runs its queries atomically with bmdb's. Do not commit or roll it
// back: bmdb does. It reaches every table, bmdb's included: leave bmdb's
// tables to bmdb's API (docs/roles.sql keeps a worker role from DDL, not
// from that).
func (t *Tx) DBTX() model.DBTX { return t.tx }

// MaxCreateMachines bounds CreateMachines.
const MaxCreateMachines = 100000

// CreateMachines inserts n new machines in the transaction and returns
// their ids. It returns an error wrapping ErrInvalidArgument for n outside
// [1, MaxCreateMachines].
func (t *Tx) CreateMachines(ctx context.Context, n int) ([]uuid.UUID, error) {
	if n < 1 || n > MaxCreateMachines {
		return nil, invalidArgument("CreateMachines: n is %d, must be in [1, %d]", n, MaxCreateMachines)
	}
	ids, err := t.q.MachineCreateMany(ctx, int64(n))
	if err != nil {
		return nil, fmt.Errorf("bmdb: creating %d machines: %w", n, err)
	}
	return ids, nil
}

// Retry delays between attempts: the n-th retry waits between half and all
// of min(txRetryBase*2^(n-1), txRetryCap).
const (
	txRetryBase = 2 * time.Millisecond
	txRetryCap  = 250 * time.Millisecond
)

// cockroachRestartsPerTx bounds the savepoint restarts of one CockroachDB
// transaction; after them the next attempt is a new transaction. On
// CockroachDB a restart keeps the transaction's priority, so it is tried
// first; on PostgreSQL (cockroach mode) a real serialization failure keeps
// failing inside the same transaction, so the budget is small.
const cockroachRestartsPerTx = 3

var serializable = &sql.TxOptions{Isolation: sql.LevelSerializable}

// txOption admits the attempts of a transaction. bmdb's claim and end
// transactions take a claim slot (Config.ClaimConcurrency) per attempt, ends
// before claims; the zero txOption (every other transaction) is not gated.
type txOption struct {
	claimSlot bool
	priority  int // priorityEnd or priorityClaim
}

// claimSlot is the txOption of claim and end transactions at priority.
func claimSlot(priority int) txOption { return txOption{claimSlot: true, priority: priority} }

// transact is the Connection's one way to run a transaction: it runs fn in
// a SERIALIZABLE transaction and commits it, retrying on serialization
// failures (SQLSTATE 40001, 40P01), lock timeouts (55P03) and connection
// failures before COMMIT, until MaxTxAttempts attempts. With a claimSlot
// option each attempt waits for a slot (ctx-aware) and gives it back before
// any wait to retry; fn must then not start claim transactions itself (with
// one slot it would wait for the one its caller holds).
//
// On CockroachDB an attempt restarts the transaction in place at a
// savepoint (crdb.ExecuteInTx); every attempt's checks use the statement's
// clock, since now() keeps its value across restarts there. On PostgreSQL
// such a restart is futile (the transaction keeps its snapshot and fails
// again) and unsafe (crdb ignores a 40001 raised by the final COMMIT), so
// each attempt is a new transaction, and a 40001 from COMMIT is retried like
// any other. Either way, attempts are separated by a jittered, capped,
// growing wait.
func (c *Connection) transact(ctx context.Context, fn func(*Tx) error, opts ...txOption) error {
	if c.closed.Load() {
		return ErrConnectionClosed
	}
	var opt txOption
	if len(opts) > 0 {
		opt = opts[0]
	}
	slots := c.claimSlots
	if !opt.claimSlot {
		slots = nil
	}
	if opt.claimSlot && c.claimGate {
		fn = c.gated(ctx, fn)
	}
	run := c.attemptPostgres
	if c.engine == engineCockroach {
		run = c.attemptCockroach
	}
	return c.retry(ctx, func(a *attempts) error {
		err := func() error {
			if err := slots.acquire(ctx, opt.priority); err != nil {
				return err
			}
			defer slots.release()
			return run(ctx, a, fn)
		}()
		if opt.claimSlot && c.claimGate && sqlState(err) == codeSerializationFailure {
			c.turnGateOn(ctx)
		}
		return err
	})
}

// sqlClaimGate is the first statement of a batch transaction on
// PostgreSQL while the gate is on (migration 000013 explains the table).
// LOCK TABLE takes no snapshot, so the transaction's snapshot, taken by
// its next statement, sees every batch committed before it.
const sqlClaimGate = "LOCK TABLE claim_gate IN EXCLUSIVE MODE"

// gateHold is how long the claim gate stays on after a batch transaction
// failed with a serialization error (another process's batch ran beside
// it). Alone, a process pays nothing for the gate; beside others, one
// retry per gateHold turns it back on, for every process.
const gateHold = 30 * time.Second

// turnGateOn turns the claim gate on, for this connection at once and for
// every other at its next session check (the claim_gate row), unless it is
// on already here. Failing to write the row only delays the others; it is
// logged.
func (c *Connection) turnGateOn(ctx context.Context) {
	if c.gateOn() {
		return
	}
	c.holdGate(gateHold)
	// Bounded by the batch's context (the session, its calls' deadlines):
	// the write waits for gated batches holding the table.
	ctx, cancel := context.WithTimeout(ctx, c.cfg.SessionInterval/4)
	defer cancel()
	err := c.transact(ctx, func(tx *Tx) error {
		return tx.q.ClaimGateOn(ctx, gateHold.Seconds())
	})
	if err != nil {
		klog.V(1).Infof("bmdb: turning the claim gate on for other processes: %v", err)
	}
}

// gateOn reports whether this connection's batches take the claim gate.
func (c *Connection) gateOn() bool { return time.Now().UnixNano() < c.gateUntil.Load() }

// holdGate keeps the claim gate on here for at least d from now.
func (c *Connection) holdGate(d time.Duration) {
	until := time.Now().Add(d).UnixNano()
	for {
		old := c.gateUntil.Load()
		if old >= until || c.gateUntil.CompareAndSwap(old, until) {
			return
		}
	}
}

// gated is fn behind the claim gate while it is on: the attempt waits for
// the gate (at most lock_timeout, then a retryable 55P03) and holds it
// until the transaction ends.
func (c *Connection) gated(ctx context.Context, fn func(*Tx) error) func(*Tx) error {
	return func(tx *Tx) error {
		if c.gateOn() {
			if _, err := tx.tx.ExecContext(ctx, sqlClaimGate); err != nil {
				return fmt.Errorf("bmdb: waiting for the claim gate: %w", err)
			}
		}
		return fn(tx)
	}
}

// attempts counts the attempts of one transaction and keeps the last
// retryable error, across savepoint restarts and new transactions.
type attempts struct {
	n, max int
	last   error
}

// retry runs attempt until it succeeds, fails for good, or MaxTxAttempts
// attempts have failed with retryable errors, waiting between attempts.
func (c *Connection) retry(ctx context.Context, attempt func(*attempts) error) error {
	a := &attempts{max: c.cfg.MaxTxAttempts}
	for waits := 1; ; waits++ {
		err := attempt(a)
		if err == nil || ctx.Err() != nil || errors.Is(err, ErrRetriesExhausted) {
			return err
		}
		var restart *restartError
		switch {
		case errors.As(err, &restart):
			// counted where it happened
		case retryable(err):
			c.countRetry(retryReason(err))
		case errors.Is(err, errConnectionBeforeCommit):
			c.countRetry(retryConnection)
		default:
			return err
		}
		a.last = err
		if restart != nil {
			a.last = restart.last
		}
		if a.n >= a.max {
			return &RetriesExhaustedError{Attempts: a.n, Last: a.last}
		}
		if err := wait.Sleep(ctx, retryDelay(waits)); err != nil {
			return fmt.Errorf("bmdb: waiting to retry transaction: %w", err)
		}
	}
}

// retryable reports whether err allows running the whole transaction
// again: a serialization failure, a lock timeout, a lease whose deadline
// the transaction's snapshot had not seen extended, or a cached prepared
// statement that went stale (prepared again on the next attempt).
func retryable(err error) bool {
	return isRetryable(err) || errors.Is(err, errStaleLease) || errors.Is(err, errStaleStatement)
}

// errConnectionBeforeCommit marks a connection failure before COMMIT was
// sent: the server rolled the transaction back, so it is safe to retry.
var errConnectionBeforeCommit = errors.New("bmdb: connection failed before commit")

// attemptPostgres runs one whole transaction: BEGIN, fn, COMMIT. A
// connection failure before COMMIT comes back marked with
// errConnectionBeforeCommit; one during COMMIT as ErrAmbiguousCommit.
func (c *Connection) attemptPostgres(ctx context.Context, a *attempts, fn func(*Tx) error) error {
	a.n++
	c.countAttempt()
	tx, err := c.db.BeginTx(ctx, serializable)
	if err != nil {
		return markConnection(fmt.Errorf("bmdb: beginning transaction: %w", contextError(ctx, err)))
	}
	if err := fn(c.newTx(tx)); err != nil {
		_ = tx.Rollback() // the error that matters is fn's
		return markConnection(contextError(ctx, err))
	}
	if err := c.commit(tx); err != nil {
		return c.commitError(ctx, err)
	}
	return nil
}

// commit commits tx (through the test hook, if set).
func (c *Connection) commit(tx *sql.Tx) error {
	if hook := c.hooks.commit; hook != nil {
		return hook(tx)
	}
	return tx.Commit()
}

// commitError classifies an error of COMMIT on PostgreSQL: a serialization
// failure is retried; a lost connection or 40003 leaves the outcome
// unknown.
func (c *Connection) commitError(ctx context.Context, err error) error {
	switch {
	case isRetryable(err):
		c.stats.txCommitRetries.Add(1)
	case isConnectionError(err) || sqlState(err) == codeStatementCompletionUnknown:
		return fmt.Errorf("%w: %w", ErrAmbiguousCommit, err)
	}
	return fmt.Errorf("bmdb: committing transaction: %w", contextError(ctx, err))
}

// markConnection marks err with errConnectionBeforeCommit if it is a
// connection failure.
func markConnection(err error) error {
	if isConnectionError(err) {
		return fmt.Errorf("%w: %w", errConnectionBeforeCommit, err)
	}
	return err
}

// restartError ends a CockroachDB transaction whose savepoint restarts are
// used up, so that the next attempt is a new transaction. It wraps no
// database error, so that crdb does not retry it in place.
type restartError struct{ last error }

func (e *restartError) Error() string {
	return fmt.Sprintf("bmdb: restarting transaction anew after %v", e.last)
}

// attemptCockroach runs fn in one transaction with crdb.ExecuteInTx, which
// restarts it in place (ROLLBACK TO SAVEPOINT) on serialization failures,
// after a jittered wait, up to cockroachRestartsPerTx times. A failure at
// RELEASE (CockroachDB's commit point) is retried like any other; one that
// leaves the outcome unknown returns ErrAmbiguousCommit. On a PostgreSQL
// server (cockroach mode) RELEASE commits nothing, so COMMIT's error, which
// crdb ignores, is classified as attemptPostgres does.
func (c *Connection) attemptCockroach(ctx context.Context, a *attempts, fn func(*Tx) error) error {
	tx, err := c.db.BeginTx(ctx, serializable)
	if err != nil {
		a.n++
		c.countAttempt()
		return markConnection(fmt.Errorf("bmdb: beginning transaction: %w", contextError(ctx, err)))
	}
	adapter := &crdbTx{tx: tx, c: c}
	restarts := 0
	err = crdb.ExecuteInTx(ctx, adapter, func() error {
		if restarts > 0 {
			a.last = adapter.failure
			c.countRetry(retrySerialization)
			if adapter.releaseFailed {
				c.stats.txCommitRetries.Add(1)
			}
			if a.n >= a.max {
				return errAttemptsExceeded
			}
			if restarts >= cockroachRestartsPerTx {
				return &restartError{last: a.last}
			}
			if err := wait.Sleep(ctx, retryDelay(restarts)); err != nil {
				return fmt.Errorf("bmdb: waiting to retry transaction: %w", err)
			}
		}
		restarts++
		a.n++
		c.countAttempt()
		adapter.releaseFailed = false
		tooLong := c.attemptDeadline()
		err := fn(c.newTx(tx))
		if err == nil {
			err = tooLong()
		}
		if isRetryable(err) {
			adapter.failure = err
		}
		return err
	})
	var ambiguous *crdb.AmbiguousCommitError
	switch {
	case err == nil && adapter.commitErr != nil && c.onPostgres:
		return c.commitError(ctx, adapter.commitErr)
	case err == nil:
		return nil
	case errors.As(err, &ambiguous) || sqlState(err) == codeStatementCompletionUnknown:
		return fmt.Errorf("%w: %w", ErrAmbiguousCommit, err)
	}
	if errors.Is(err, errAttemptsExceeded) {
		return &RetriesExhaustedError{Attempts: a.n, Last: a.last}
	}
	var restart *restartError
	if errors.As(err, &restart) {
		return err
	}
	return markConnection(contextError(ctx, err))
}

// errAttemptsExceeded stops crdb.ExecuteInTx after MaxTxAttempts attempts.
// It wraps no database error, so that crdb does not retry it.
var errAttemptsExceeded = errors.New("bmdb: transaction attempts exceeded")

// crdbTx adapts *sql.Tx to crdb.Tx, and remembers what crdb does not
// report: why RELEASE failed (CockroachDB's commit point) and COMMIT's
// error.
type crdbTx struct {
	tx *sql.Tx
	c  *Connection

	failure       error // the last retryable error of the callback or RELEASE
	releaseFailed bool  // the last failure came from RELEASE
	commitErr     error
}

func (t *crdbTx) Exec(ctx context.Context, query string, args ...any) error {
	_, err := t.tx.ExecContext(ctx, query, args...)
	if err != nil && query == sqlRelease && isRetryable(err) {
		t.failure, t.releaseFailed = err, true
	}
	return err
}

func (t *crdbTx) Commit(context.Context) error {
	t.commitErr = t.c.commit(t.tx)
	return t.commitErr
}

func (t *crdbTx) Rollback(context.Context) error { return t.tx.Rollback() }

func (c *Connection) countAttempt() {
	c.stats.txAttempts.Add(1)
	c.metrics.txAttempts.Inc()
}

// Reasons of retries, the label of bmdb_transaction_retries_total.
const (
	retrySerialization = "serialization"
	retryLockTimeout   = "lock_timeout"
	retryDeadlock      = "deadlock"
	retryConnection    = "connection"
)

// retryReason is the reason of a retry for retryable error err.
func retryReason(err error) string {
	switch sqlState(err) {
	case codeLockNotAvailable:
		return retryLockTimeout
	case codeDeadlockDetected:
		return retryDeadlock
	}
	return retrySerialization
}

func (c *Connection) countRetry(reason string) {
	switch reason {
	case retryConnection:
		c.stats.txConnectionRetries.Add(1)
	case retryLockTimeout:
		c.stats.txLockTimeouts.Add(1)
		c.stats.txRetries.Add(1)
	case retryDeadlock:
		c.stats.txDeadlocks.Add(1)
		c.stats.txRetries.Add(1)
	default:
		c.stats.txRetries.Add(1)
	}
	c.metrics.m.txRetries.WithLabelValues(c.metrics.component, reason).Inc()
}

// retryDelay returns the jittered wait before retry number attempt (from 1).
func retryDelay(attempt int) time.Duration {
	d := txRetryCap
	if attempt < 16 {
		d = min(txRetryBase<<(attempt-1), txRetryCap)
	}
	return d/2 + rand.N(d/2+1)
}
