package lease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/txn"
)

// Every transaction of a session checks the session on the database
// clock, first (before its first write) and last (right before COMMIT),
// and its read of the session row orders it against a takeover or GC,
// which delete the row: on PostgreSQL the read locks the row FOR KEY SHARE
// until the transaction ends; on CockroachDB, where that is a plain read,
// the transaction commits before the delete or fails its read refresh
// (bmdb's package doc). The first check is Check, or a claim or end
// statement that checks as it runs (Checked); the last is BeforeCommit,
// which runs the statement only if one ran since the last check
// (txn.Tx.NeedsCheck).

// Check verifies inside tx that the session is alive on the database clock
// (SessionCheck): the attempt's first check. A session the database has
// expired is ended, and its error returned.
func (l *Lease) Check(ctx context.Context, tx *txn.Tx) error {
	_, err := tx.Store().SessionCheck(ctx, l.id)
	if isNoRows(err) {
		l.Expire()
		return context.Cause(l.ctx)
	}
	if err != nil {
		return fmt.Errorf("bmdb: checking session: %w", err)
	}
	tx.Checked()
	if hook := l.hooks.AfterSessionCheck; hook != nil {
		hook(l.id)
	}
	return nil
}

// Checked applies what a statement that checked the session as it ran
// (WorkClaimMany, WorkFinishMany) found. Alive: nil. Not alive at the
// attempt's first check: the session has ended on the database clock. At
// a later one: as in BeforeCommit.
func (l *Lease) Checked(tx *txn.Tx, alive bool) error {
	first := !tx.EverChecked()
	if !alive {
		if first {
			l.Expire()
			return context.Cause(l.ctx)
		}
		return l.staleLease()
	}
	tx.Checked()
	if first {
		if hook := l.hooks.AfterSessionCheck; hook != nil {
			hook(l.id)
		}
	}
	return nil
}

// BeforeCommit is the last liveness check, right before COMMIT: the local
// deadline first, then, unless the attempt's last statement checked it,
// the database clock (SessionCheckBeforeCommit), which also lowers the
// server's idle-in-transaction timeout to the time the session has left.
// So a transaction that passes it commits within one round trip, or, if
// the client stalls before COMMIT, is ended by the server: at the deadline
// on PostgreSQL; on CockroachDB, where bmdb does not rely on the lowered
// timeout, one interval after the check. It is the transaction's
// txn.Guard.
func (l *Lease) BeforeCommit(ctx context.Context, tx *txn.Tx) error {
	if err := l.Alive(); err != nil {
		return err
	}
	if tx.NeedsCheck() {
		_, err := tx.Store().SessionCheckBeforeCommit(ctx, store.SessionCheckBeforeCommitParams{
			SessionID: l.id, MaxIdleMs: l.MaxIdleMs(),
		})
		switch {
		case isNoRows(err):
			return l.staleLease()
		case err != nil:
			return fmt.Errorf("bmdb: checking session before commit: %w", err)
		}
		tx.Checked()
	}
	if hook := l.hooks.BeforeCommit; hook != nil {
		hook(l.id)
	}
	return nil
}

// staleLease is the error of a check, after the first of its transaction,
// that found the session past the deadline the transaction's snapshot
// holds: the session's own error if it has ended locally too; otherwise a
// heartbeat extended it after the snapshot was taken, and the transaction
// runs again (txn.ErrStaleLease).
func (l *Lease) staleLease() error {
	if err := l.Alive(); err != nil {
		return err
	}
	return txn.ErrStaleLease
}

// MaxIdleMs is the idle-in-transaction timeout a check sets: the time the
// session has left, at most the connections' own, at least 1 ms.
func (l *Lease) MaxIdleMs() int64 {
	left := time.Until(*l.localDeadline.Load())
	return max(min(left, l.cfg.IdleInTransaction).Milliseconds(), 1)
}

func isNoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) }
