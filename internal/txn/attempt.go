package txn

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/cockroachdb/cockroach-go/v2/crdb"

	"github.com/bmdb-dev/bmdb/internal/counters"
	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/wait"
)

// cockroachRestartsPerTx bounds the savepoint restarts of one CockroachDB
// transaction (each reads at a new timestamp, and keeps its priority);
// after them the next attempt is a new transaction.
const cockroachRestartsPerTx = 3

// errConnectionBeforeCommit marks a connection failure before COMMIT was
// sent: the server rolled the transaction back, so it is safe to retry.
var errConnectionBeforeCommit = errors.New("bmdb: connection failed before commit")

// attemptPostgres is one attempt on PostgreSQL: BEGIN at opts' isolation,
// body, the guard's last check, COMMIT, read top to bottom. A connection
// failure before COMMIT comes back marked with errConnectionBeforeCommit;
// one during COMMIT, or a 40003, as ErrAmbiguousCommit; a serialization
// failure of COMMIT (write skew under SERIALIZABLE) is retried like any
// other.
func (r *Runner) attemptPostgres(ctx context.Context, a *attempts, opts *sql.TxOptions, guard Guard, body func(*Tx) error) error {
	a.n++
	r.countAttempt()
	sqlTx, err := r.DB.BeginTx(ctx, opts)
	if err != nil {
		return markConnection(fmt.Errorf("bmdb: beginning transaction: %w", dbconn.ContextError(ctx, err)))
	}
	tx := newTx(sqlTx)
	err = body(tx)
	if err == nil && guard != nil {
		err = guard.BeforeCommit(ctx, tx)
	}
	if err != nil {
		_ = sqlTx.Rollback() // the error that matters is body's
		return markConnection(dbconn.ContextError(ctx, err))
	}
	commit := sqlTx.Commit
	if hook := r.Hooks.Commit; hook != nil {
		commit = func() error { return hook(sqlTx) }
	}
	switch err := commit(); {
	case err == nil:
		return nil
	case dbconn.IsRetryable(err):
		r.Counters.CommitRetries.Add(1)
		return fmt.Errorf("bmdb: committing transaction: %w", err)
	case dbconn.IsConnectionError(err) || dbconn.SQLState(err) == dbconn.CodeStatementCompletionUnknown:
		return fmt.Errorf("%w: %w", ErrAmbiguousCommit, err)
	default:
		return fmt.Errorf("bmdb: committing transaction: %w", dbconn.ContextError(ctx, err))
	}
}

// markConnection marks err with errConnectionBeforeCommit if it is a
// connection failure.
func markConnection(err error) error {
	if dbconn.IsConnectionError(err) {
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

// errAttemptsExceeded stops crdb.ExecuteInTx after MaxAttempts attempts.
// It wraps no database error, so that crdb does not retry it.
var errAttemptsExceeded = errors.New("bmdb: transaction attempts exceeded")

// attemptCockroach is one attempt on CockroachDB: one transaction run
// through crdb.ExecuteInTx, which restarts the body (and the guard's last
// check) in place (ROLLBACK TO SAVEPOINT) after a serialization failure,
// here after a jittered wait, up to cockroachRestartsPerTx times. A
// failure at RELEASE (the commit point) is retried like any other; one
// that leaves the outcome unknown returns ErrAmbiguousCommit. An attempt
// whose body ran longer than MaxAttemptDuration ends with
// ErrTransactionTooLong (limit.go).
func (r *Runner) attemptCockroach(ctx context.Context, a *attempts, guard Guard, body func(*Tx) error) error {
	sqlTx, err := r.DB.BeginTx(ctx, Serializable)
	if err != nil {
		a.n++
		r.countAttempt()
		return markConnection(fmt.Errorf("bmdb: beginning transaction: %w", dbconn.ContextError(ctx, err)))
	}
	adapter := &crdbTx{tx: sqlTx}
	restarts := 0
	err = crdb.ExecuteInTx(ctx, adapter, func() error {
		if restarts > 0 {
			a.last = adapter.failure
			r.countRetry(counters.RetrySerialization)
			if adapter.releaseFailed {
				r.Counters.CommitRetries.Add(1)
			}
			if a.n >= a.max {
				return errAttemptsExceeded
			}
			if restarts >= cockroachRestartsPerTx {
				return &restartError{last: a.last}
			}
			if err := wait.Sleep(ctx, RetryDelay(restarts)); err != nil {
				return fmt.Errorf("bmdb: waiting to retry transaction: %w", err)
			}
		}
		restarts++
		a.n++
		r.countAttempt()
		adapter.releaseFailed = false
		tooLong := r.attemptDeadline()
		tx := newTx(sqlTx)
		err := body(tx)
		if err == nil && guard != nil {
			err = guard.BeforeCommit(ctx, tx)
		}
		if err == nil {
			err = tooLong()
		}
		if dbconn.IsRetryable(err) {
			adapter.failure = err
		}
		return err
	})
	var ambiguous *crdb.AmbiguousCommitError
	var restart *restartError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ambiguous) || dbconn.SQLState(err) == dbconn.CodeStatementCompletionUnknown:
		return fmt.Errorf("%w: %w", ErrAmbiguousCommit, err)
	case errors.Is(err, errAttemptsExceeded):
		return &RetriesExhaustedError{Attempts: a.n, Last: a.last}
	case errors.As(err, &restart):
		return err
	}
	return markConnection(dbconn.ContextError(ctx, err))
}

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
	if err != nil && query == sqlRelease && dbconn.IsRetryable(err) {
		t.failure, t.releaseFailed = err, true
	}
	return err
}

// Commit ends the transaction, which RELEASE committed (crdb ignores what
// it returns).
func (t *crdbTx) Commit(context.Context) error { return t.tx.Commit() }

func (t *crdbTx) Rollback(context.Context) error { return t.tx.Rollback() }
