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

// CreateMachines inserts n new machines in the transaction and returns
// their ids. It returns an error wrapping ErrInvalidArgument for n outside
// [1, MaxCreateMachines]: one call is one INSERT, and on CockroachDB a
// transaction must reach its commit within Config.MaxTransactionDuration.
// Create more machines in several transactions.
func (t *Tx) CreateMachines(ctx context.Context, n int) ([]uuid.UUID, error) {
	if n < 1 || n > MaxCreateMachines {
		return nil, invalidArgument("CreateMachines: n is %d, must be in [1, %d] (create more in several transactions)", n, MaxCreateMachines)
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
// transaction (each reads at a new timestamp, and keeps its priority);
// after them the next attempt is a new transaction.
const cockroachRestartsPerTx = 3

// The isolation levels of bmdb's transactions: SERIALIZABLE, and
// snapshot isolation for batch transactions on PostgreSQL
// (Config.SerializableBatches); CockroachDB runs every one SERIALIZABLE.
var (
	serializable = &sql.TxOptions{Isolation: sql.LevelSerializable}
	snapshot     = &sql.TxOptions{Isolation: sql.LevelRepeatableRead}
	// readCommitted is the controls' (controls.go), on PostgreSQL.
	readCommitted = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
)

// transact is the Connection's one transaction runner: it runs body in a
// transaction and commits it, the whole attempt again after a
// serialization failure (SQLSTATE 40001, 40P01), a lock timeout (55P03) or
// a connection failure before COMMIT, until MaxTxAttempts attempts, with a
// jittered, capped, growing wait between attempts, and at once after an
// attempt that asks to run again (errRerun). body checks the session, if
// it has one, first and last (Session.transact, batcher.attempt).
//
// An attempt is engine's: attemptPostgres runs a new transaction at opts'
// isolation; attemptCockroach runs a SERIALIZABLE one through
// crdb.ExecuteInTx, which restarts it in place (each restart reads at a
// new timestamp), and whose commit point is RELEASE. On PostgreSQL a
// restart in place would keep the snapshot and fail again, and crdb
// ignores a 40001 raised by the final COMMIT, which is why each attempt
// there is a new transaction. Every liveness check uses the statement's
// clock, since now() keeps its value across restarts on CockroachDB.
func (c *Connection) transact(ctx context.Context, opts *sql.TxOptions, body func(*Tx) error) error {
	if c.closed.Load() {
		return ErrConnectionClosed
	}
	a := &attempts{max: c.cfg.MaxTxAttempts}
	waits, reruns := 0, 0
	for {
		var err error
		if c.engine == engineCockroach {
			err = c.attemptCockroach(ctx, a, body)
		} else {
			err = c.attemptPostgres(ctx, a, opts, body)
		}
		var restart *restartError
		switch {
		case err == nil || errors.Is(err, ErrRetriesExhausted):
			return err
		case ctx.Err() != nil:
			// Ended meanwhile (the session, the callers): say why, not
			// that the attempt was to run again.
			if errors.As(err, &restart) {
				err = restart.last
			}
			return contextError(ctx, err)
		}
		switch {
		case errors.Is(err, errRerun):
			// Not a failure: at once the first times in a row, then after
			// the usual waits (others keep taking its candidates).
			if reruns++; reruns <= rerunsAtOnce {
				a.last = err
				if a.n >= a.max {
					return &RetriesExhaustedError{Attempts: a.n, Last: a.last}
				}
				continue
			}
		case errors.As(err, &restart):
			err = restart.last // counted where it happened
		case retryable(err):
			c.countRetry(retryReasonOf(err))
		case errors.Is(err, errConnectionBeforeCommit):
			c.countRetry(retryConnection)
		default:
			return err
		}
		a.last = err
		if a.n >= a.max {
			return &RetriesExhaustedError{Attempts: a.n, Last: a.last}
		}
		waits++
		if err := wait.Sleep(ctx, retryDelay(waits)); err != nil {
			return fmt.Errorf("bmdb: waiting to retry transaction: %w", err)
		}
	}
}

// attempts counts the attempts of one transaction and keeps the last
// retryable error, across savepoint restarts and new transactions.
type attempts struct {
	n, max int
	last   error
}

// errRerun ends an attempt that found out it must run again with a new
// snapshot (a claim met a stale candidate, or found pairs without claim
// rows and made them: claim.go): it is rolled back and run again, not
// counted as a retry.
var errRerun = errors.New("bmdb: transaction to run again with a new snapshot")

// rerunsAtOnce is how many errRerun attempts in a row run again at once.
const rerunsAtOnce = 10

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

// attemptPostgres is one attempt on PostgreSQL: BEGIN at opts' isolation,
// body, COMMIT. A connection failure before COMMIT comes back marked with
// errConnectionBeforeCommit; one during COMMIT, or a 40003, as
// ErrAmbiguousCommit; a serialization failure of COMMIT (write skew under
// SERIALIZABLE) is retried like any other.
func (c *Connection) attemptPostgres(ctx context.Context, a *attempts, opts *sql.TxOptions, body func(*Tx) error) error {
	a.n++
	c.countAttempt()
	tx, err := c.db.BeginTx(ctx, opts)
	if err != nil {
		return markConnection(fmt.Errorf("bmdb: beginning transaction: %w", contextError(ctx, err)))
	}
	if err := body(c.newTx(tx)); err != nil {
		_ = tx.Rollback() // the error that matters is body's
		return markConnection(contextError(ctx, err))
	}
	commit := tx.Commit
	if hook := c.hooks.commit; hook != nil {
		commit = func() error { return hook(tx) }
	}
	switch err := commit(); {
	case err == nil:
		return nil
	case isRetryable(err):
		c.stats.commitRetries.Add(1)
		return fmt.Errorf("bmdb: committing transaction: %w", err)
	case isConnectionError(err) || sqlState(err) == codeStatementCompletionUnknown:
		return fmt.Errorf("%w: %w", ErrAmbiguousCommit, err)
	default:
		return fmt.Errorf("bmdb: committing transaction: %w", contextError(ctx, err))
	}
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

// attemptCockroach is one attempt on CockroachDB: one transaction run
// through crdb.ExecuteInTx, which restarts body in place (ROLLBACK TO
// SAVEPOINT) after a serialization failure, here after a jittered wait, up
// to cockroachRestartsPerTx times. A failure at RELEASE (the commit point)
// is retried like any other; one that leaves the outcome unknown returns
// ErrAmbiguousCommit. An attempt whose body ran longer than
// Config.MaxTransactionDuration ends with ErrTransactionTooLong (txlimit.go).
func (c *Connection) attemptCockroach(ctx context.Context, a *attempts, body func(*Tx) error) error {
	tx, err := c.db.BeginTx(ctx, serializable)
	if err != nil {
		a.n++
		c.countAttempt()
		return markConnection(fmt.Errorf("bmdb: beginning transaction: %w", contextError(ctx, err)))
	}
	adapter := &crdbTx{tx: tx}
	restarts := 0
	err = crdb.ExecuteInTx(ctx, adapter, func() error {
		if restarts > 0 {
			a.last = adapter.failure
			c.countRetry(retrySerialization)
			if adapter.releaseFailed {
				c.stats.commitRetries.Add(1)
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
		err := body(c.newTx(tx))
		if err == nil {
			err = tooLong()
		}
		if isRetryable(err) {
			adapter.failure = err
		}
		return err
	})
	var ambiguous *crdb.AmbiguousCommitError
	var restart *restartError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ambiguous) || sqlState(err) == codeStatementCompletionUnknown:
		return fmt.Errorf("%w: %w", ErrAmbiguousCommit, err)
	case errors.Is(err, errAttemptsExceeded):
		return &RetriesExhaustedError{Attempts: a.n, Last: a.last}
	case errors.As(err, &restart):
		return err
	}
	return markConnection(contextError(ctx, err))
}

// errAttemptsExceeded stops crdb.ExecuteInTx after MaxTxAttempts attempts.
// It wraps no database error, so that crdb does not retry it.
var errAttemptsExceeded = errors.New("bmdb: transaction attempts exceeded")

// sqlRelease is crdb's RELEASE SAVEPOINT, CockroachDB's commit point.
const sqlRelease = "RELEASE SAVEPOINT cockroach_restart"

// crdbTx adapts *sql.Tx to crdb.Tx, and remembers what crdb does not
// report: why RELEASE failed.
type crdbTx struct {
	tx *sql.Tx

	failure       error // the last retryable error of the callback or RELEASE
	releaseFailed bool  // the last failure came from RELEASE
}

func (t *crdbTx) Exec(ctx context.Context, query string, args ...any) error {
	_, err := t.tx.ExecContext(ctx, query, args...)
	if err != nil && query == sqlRelease && isRetryable(err) {
		t.failure, t.releaseFailed = err, true
	}
	return err
}

// Commit ends the transaction, which RELEASE committed (crdb ignores what
// it returns).
func (t *crdbTx) Commit(context.Context) error { return t.tx.Commit() }

func (t *crdbTx) Rollback(context.Context) error { return t.tx.Rollback() }

func (c *Connection) countAttempt() { c.stats.attempts.Add(1) }

// retryReasonOf is the reason of a retry for retryable error err.
func retryReasonOf(err error) retryReason {
	switch sqlState(err) {
	case codeLockNotAvailable:
		return retryLockTimeout
	case codeDeadlockDetected:
		return retryDeadlock
	}
	return retrySerialization
}

func (c *Connection) countRetry(reason retryReason) { c.stats.retries[reason].Add(1) }

// retryDelay returns the jittered wait before retry number attempt (from 1).
func retryDelay(attempt int) time.Duration {
	d := txRetryCap
	if attempt < 16 {
		d = min(txRetryBase<<(attempt-1), txRetryCap)
	}
	return d/2 + rand.N(d/2+1)
}
