package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/cockroachdb/cockroach-go/v2/crdb"

	"github.com/bmdb-dev/bmdb/internal/wait"
	"github.com/bmdb-dev/bmdb/model"
)

// Tx is one attempt of a bmdb transaction. It is valid only inside the
// callback it was passed to, and not safe for concurrent use.
type Tx struct {
	tx *sql.Tx
	q  *model.Queries
}

// newTx wraps one attempt's transaction; its queries use the connection's
// prepared statements.
func (c *Connection) newTx(tx *sql.Tx) *Tx { return &Tx{tx: tx, q: c.prepared.WithTx(tx)} }

// Queries returns bmdb's generated queries bound to the transaction.
func (t *Tx) Queries() *model.Queries { return t.q }

// DBTX returns the transaction as the interface sqlc generates for
// database/sql, so that an application passes it to its own sqlc package's
// New and runs its queries atomically with bmdb's. Do not commit or roll it
// back: bmdb does.
func (t *Tx) DBTX() model.DBTX { return t.tx }

// Retry delays between whole-transaction attempts on PostgreSQL: the n-th
// retry waits between half and all of min(txRetryBase*2^(n-1), txRetryCap).
const (
	txRetryBase = 2 * time.Millisecond
	txRetryCap  = 250 * time.Millisecond
)

var serializable = &sql.TxOptions{Isolation: sql.LevelSerializable}

// transact runs fn in a SERIALIZABLE transaction and commits it, retrying on
// serialization failures (SQLSTATE 40001, 40P01) until MaxTxAttempts.
//
// On CockroachDB it uses crdb.ExecuteTx, which restarts the transaction in
// place at a savepoint. On PostgreSQL that is futile (the restarted
// transaction keeps its snapshot and fails again) and unsafe (crdb ignores a
// 40001 raised by the final COMMIT), so there each attempt is a new
// transaction, and a 40001 from COMMIT is retried like any other, after a
// jittered, capped wait.
func (c *Connection) transact(ctx context.Context, fn func(*Tx) error) error {
	return c.transactGated(ctx, nil, fn)
}

// gate admits one attempt of a transaction: it returns when the attempt may
// begin, with the function that ends its admission, or ctx's cause. It
// holds nothing across the waits between attempts.
type gate func(ctx context.Context) (release func(), err error)

// transactGated is transact with each attempt admitted by enter (nil: no
// gate).
func (c *Connection) transactGated(ctx context.Context, enter gate, fn func(*Tx) error) error {
	if c.closed.Load() {
		return ErrConnectionClosed
	}
	attempt := func(run func() error) error {
		if enter == nil {
			return run()
		}
		release, err := enter(ctx)
		if err != nil {
			return err
		}
		defer release()
		return run()
	}
	if c.engine == engineCockroach {
		return c.retry(ctx, func() error { return attempt(func() error { return c.attemptCockroach(ctx, fn) }) })
	}
	return c.retry(ctx, func() error { return attempt(func() error { return c.attemptPostgres(ctx, fn) }) })
}

// retry runs attempt until it succeeds, fails for good, or MaxTxAttempts
// attempts have failed with serialization or connection errors, waiting a
// jittered, capped, growing delay between attempts.
func (c *Connection) retry(ctx context.Context, attempt func() error) error {
	for n := 1; ; n++ {
		err := attempt()
		if err == nil || ctx.Err() != nil || errors.Is(err, ErrRetriesExhausted) {
			return err
		}
		switch {
		case isRetryable(err):
			c.countRetry(retrySerialization)
		case errors.Is(err, errConnectionBeforeCommit):
			c.countRetry(retryConnection)
		default:
			return err
		}
		if n >= c.cfg.MaxTxAttempts {
			return &RetriesExhaustedError{Attempts: n, Last: err}
		}
		if err := wait.Sleep(ctx, retryDelay(n)); err != nil {
			return fmt.Errorf("bmdb: waiting to retry transaction: %w", err)
		}
	}
}

// errConnectionBeforeCommit marks a connection failure before COMMIT was
// sent: the server rolled the transaction back, so it is safe to retry.
var errConnectionBeforeCommit = errors.New("bmdb: connection failed before commit")

// attemptPostgres runs one whole transaction: BEGIN, fn, COMMIT. A
// connection failure before COMMIT comes back marked with
// errConnectionBeforeCommit; one during COMMIT as ErrAmbiguousCommit.
func (c *Connection) attemptPostgres(ctx context.Context, fn func(*Tx) error) error {
	c.countAttempt()
	tx, err := c.db.BeginTx(ctx, serializable)
	if err != nil {
		return markConnection(fmt.Errorf("bmdb: beginning transaction: %w", contextError(ctx, err)))
	}
	if err := fn(c.newTx(tx)); err != nil {
		_ = tx.Rollback() // the error that matters is fn's
		return markConnection(contextError(ctx, err))
	}
	commit := tx.Commit
	if hook := c.hooks.commit; hook != nil {
		commit = func() error { return hook(tx) }
	}
	if err := commit(); err != nil {
		if isRetryable(err) {
			c.stats.txCommitRetries.Add(1)
		} else if isConnectionError(err) {
			return fmt.Errorf("%w: %w", ErrAmbiguousCommit, err)
		}
		return fmt.Errorf("bmdb: committing transaction: %w", contextError(ctx, err))
	}
	return nil
}

// markConnection marks err with errConnectionBeforeCommit if it is a
// connection failure.
func markConnection(err error) error {
	if isConnectionError(err) {
		return fmt.Errorf("%w: %w", errConnectionBeforeCommit, err)
	}
	return err
}

// attemptCockroach runs fn with crdb.ExecuteTx, which retries
// serialization failures in place (savepoint restarts); connection failures
// before the commit come back marked for the retry loop around it.
func (c *Connection) attemptCockroach(ctx context.Context, fn func(*Tx) error) error {
	attempts := 0
	var last error // the last serialization failure
	// crdb counts retries, and takes 0 for "no limit": allow one more
	// than needed and stop in the callback.
	err := crdb.ExecuteTx(crdb.WithMaxRetries(ctx, c.cfg.MaxTxAttempts), c.db, serializable,
		func(tx *sql.Tx) error {
			attempts++
			if attempts > c.cfg.MaxTxAttempts {
				return errAttemptsExceeded
			}
			c.countAttempt()
			if attempts > 1 {
				c.countRetry(retrySerialization)
			}
			err := fn(c.newTx(tx))
			if isRetryable(err) {
				last = err
			}
			return err
		})
	var maxRetries *crdb.MaxRetriesExceededError
	var ambiguous *crdb.AmbiguousCommitError
	switch {
	case errors.Is(err, errAttemptsExceeded):
		return &RetriesExhaustedError{Attempts: c.cfg.MaxTxAttempts, Last: last}
	case errors.As(err, &maxRetries):
		return &RetriesExhaustedError{Attempts: attempts, Last: errors.Unwrap(maxRetries)}
	case errors.As(err, &ambiguous) || sqlState(err) == codeStatementCompletionUnknown:
		return fmt.Errorf("%w: %w", ErrAmbiguousCommit, err)
	}
	return markConnection(contextError(ctx, err))
}

// errAttemptsExceeded stops crdb.ExecuteTx after MaxTxAttempts attempts. It
// wraps no database error, so crdb does not retry it.
var errAttemptsExceeded = errors.New("bmdb: transaction attempts exceeded")

func (c *Connection) countAttempt() {
	c.stats.txAttempts.Add(1)
	c.metrics.txAttempts.Inc()
}

// Reasons of retries, the label of bmdb_transaction_retries_total.
const (
	retrySerialization = "serialization"
	retryConnection    = "connection"
)

func (c *Connection) countRetry(reason string) {
	if reason == retryConnection {
		c.stats.txConnectionRetries.Add(1)
	} else {
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

// contextError adds ctx's cause to err when ctx is done, so that a query
// aborted by cancellation (lib/pq reports "canceling statement") reads and
// matches (errors.Is) as what it is.
func contextError(ctx context.Context, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	cause := context.Cause(ctx)
	if errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w: %w", cause, err)
}
