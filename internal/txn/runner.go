// Package txn is bmdb's transaction runner, the one room that begins,
// retries and commits transactions: Runner.Run runs a body in a
// transaction, the whole attempt again after a serialization failure, a
// lock timeout or a connection failure before COMMIT, with one attempt
// function per engine, and a wall-clock bound on CockroachDB. Its Tx is
// the transaction as every other room sees it: every statement passes
// through it, and it knows whether one ran since the session was last
// checked, so that the check right before COMMIT runs by itself when a
// body wrote after the last check (Guard).
//
// Above it: the lease (package lease: sessions, their checks, GC) and
// the batch engine (package claims); bmdb's public face on top.
package txn

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/bmdb-dev/bmdb/internal/counters"
	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/wait"
)

// The isolation levels of bmdb's transactions: SERIALIZABLE; snapshot
// isolation for batch transactions on PostgreSQL
// (bmdb.Config.SerializableBatches); READ COMMITTED for the fleet
// controls' on PostgreSQL. CockroachDB runs every one SERIALIZABLE.
var (
	Serializable  = &sql.TxOptions{Isolation: sql.LevelSerializable}
	Snapshot      = &sql.TxOptions{Isolation: sql.LevelRepeatableRead}
	ReadCommitted = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
)

// Runner runs a Connection's transactions. Its fields are set before its
// first use and not changed after, but Closed and Hooks (tests). Safe for
// concurrent use.
type Runner struct {
	DB        *sql.DB
	Cockroach bool
	// MaxAttempts bounds the attempts of one transaction
	// (bmdb.Config.MaxTxAttempts).
	MaxAttempts int
	// MaxAttemptDuration bounds one attempt on CockroachDB
	// (bmdb.Config.MaxTransactionDuration; negative: no bound).
	MaxAttemptDuration time.Duration
	Counters           *counters.Counters
	// Hooks let tests inject faults; zero means none.
	Hooks Hooks
	// Closed is set when the Connection closes: Run returns
	// ErrConnectionClosed.
	Closed atomic.Bool
}

// Hooks let tests inside the module inject faults.
type Hooks struct {
	// Commit, if set, commits tx in place of tx.Commit on PostgreSQL, e.g.
	// to report a connection failure for a COMMIT that did or did not
	// happen.
	Commit func(tx *sql.Tx) error
}

// A Guard is what a transaction of a session answers to: Run calls its
// BeforeCommit, the last statement before COMMIT (package lease's Lease
// checks the session there, unless the transaction's last statement
// already did: Tx.NeedsCheck).
type Guard interface {
	BeforeCommit(ctx context.Context, tx *Tx) error
}

// Retry delays between attempts: the n-th retry waits between half and all
// of min(retryBase*2^(n-1), retryCap).
const (
	retryBase = 2 * time.Millisecond
	retryCap  = 250 * time.Millisecond
)

// RetryBase is the first retry delay, for callers that retry on their own
// (an ambiguous commit's resolution).
const RetryBase = retryBase

// RetryCap is the longest retry delay.
const RetryCap = retryCap

// rerunsAtOnce is how many ErrRerun attempts in a row run again at once.
const rerunsAtOnce = 10

// Run is the one transaction runner: it runs body in a transaction at
// opts' isolation (SERIALIZABLE on CockroachDB, whatever opts say), then,
// if guard is not nil, guard.BeforeCommit, then COMMIT; the whole attempt
// again after a serialization failure (40001, 40P01), a lock timeout
// (55P03), a stale cached statement or a connection failure before
// COMMIT, until MaxAttempts attempts, with a jittered, capped, growing
// wait between attempts, and at once after an attempt that asks to run
// again (ErrRerun).
//
// An attempt is the engine's: attemptPostgres runs a new transaction at
// opts' isolation; attemptCockroach runs a SERIALIZABLE one through
// crdb.ExecuteInTx, which restarts it in place (each restart reads at a
// new timestamp), and whose commit point is RELEASE. On PostgreSQL a
// restart in place would keep the snapshot and fail again, and crdb
// ignores a 40001 raised by the final COMMIT, which is why each attempt
// there is a new transaction.
//
// It returns nil once committed; body's error (with ctx's cause if ctx
// ended); *RetriesExhaustedError; ErrAmbiguousCommit (wrapping what
// happened) when the connection failed during COMMIT; ErrTransactionTooLong
// for an attempt that outlived MaxAttemptDuration on CockroachDB; or
// ErrConnectionClosed after the Connection closed.
func (r *Runner) Run(ctx context.Context, opts *sql.TxOptions, guard Guard, body func(*Tx) error) error {
	_, err := r.RunCounted(ctx, opts, guard, body)
	return err
}

// RunCounted is Run that also returns how many attempts it began (0 when
// it began none: the Connection was closed), for traces.
func (r *Runner) RunCounted(ctx context.Context, opts *sql.TxOptions, guard Guard, body func(*Tx) error) (int, error) {
	if r.Closed.Load() {
		return 0, ErrConnectionClosed
	}
	a := &attempts{max: r.MaxAttempts}
	err := r.run(ctx, a, opts, guard, body)
	return a.n, err
}

// run is Run's loop of attempts, counted in a.
func (r *Runner) run(ctx context.Context, a *attempts, opts *sql.TxOptions, guard Guard, body func(*Tx) error) error {
	waits, reruns := 0, 0
	for {
		var err error
		if r.Cockroach {
			err = r.attemptCockroach(ctx, a, guard, body)
		} else {
			err = r.attemptPostgres(ctx, a, opts, guard, body)
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
			return dbconn.ContextError(ctx, err)
		}
		switch {
		case errors.Is(err, ErrRerun):
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
		case Retryable(err):
			r.countRetry(retryReasonOf(err))
		case errors.Is(err, errConnectionBeforeCommit):
			r.countRetry(counters.RetryConnection)
		default:
			return err
		}
		a.last = err
		if a.n >= a.max {
			return &RetriesExhaustedError{Attempts: a.n, Last: a.last}
		}
		waits++
		if err := wait.Sleep(ctx, RetryDelay(waits)); err != nil {
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

// Retryable reports whether err allows running the whole transaction
// again: a serialization failure, a lock timeout, a lease whose deadline
// the transaction's snapshot had not seen extended (ErrStaleLease), or a
// cached prepared statement that went stale (prepared again on the next
// attempt).
func Retryable(err error) bool {
	return dbconn.IsRetryable(err) || errors.Is(err, ErrStaleLease) || errors.Is(err, dbconn.ErrStaleStatement)
}

// retryReasonOf is the reason of a retry for retryable error err.
func retryReasonOf(err error) counters.RetryReason {
	switch dbconn.SQLState(err) {
	case dbconn.CodeLockNotAvailable:
		return counters.RetryLockTimeout
	case dbconn.CodeDeadlockDetected:
		return counters.RetryDeadlock
	}
	return counters.RetrySerialization
}

func (r *Runner) countAttempt()                          { r.Counters.Attempts.Add(1) }
func (r *Runner) countRetry(reason counters.RetryReason) { r.Counters.Retries[reason].Add(1) }

// RetryDelay returns the jittered wait before retry number attempt (from 1).
func RetryDelay(attempt int) time.Duration {
	d := retryCap
	if attempt < 16 {
		d = min(retryBase<<(attempt-1), retryCap)
	}
	return d/2 + rand.N(d/2+1)
}
