package lease

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/txn"
)

// A session that expired is superseded by a takeover (a claim that meets
// one of its claims: package claims) or by GC: in one transaction, its
// row is locked, its claims are ended as Abandoned and it is deleted.
// Deleting the row is what orders the superseding transaction after every
// transaction of that session, which all read it, or aborts them. On
// PostgreSQL their read is a FOR KEY SHARE lock that the delete waits for.
// On CockroachDB it is a plain read (shared locks are off under
// SERIALIZABLE, and bmdb pins them off): the delete lands above the
// transaction's read timestamp, so the transaction either commits below
// it (serialized before the takeover) or, pushed above it, fails its read
// refresh with 40001 and its retry finds no session.

// Supersede deletes the given expired sessions, locked by tx, after
// ending their claims as Abandoned, and returns the processes of those
// claims and the number of sessions deleted.
func Supersede(ctx context.Context, tx *txn.Tx, sessions []uuid.UUID) ([]string, int64, error) {
	if len(sessions) == 0 {
		return nil, 0, nil
	}
	q := tx.Store()
	abandoned, err := q.WorkAbandonOfSessions(ctx, sessions)
	if err != nil {
		return nil, 0, fmt.Errorf("bmdb: abandoning work of expired sessions: %w", err)
	}
	deleted, err := q.SessionDeleteMany(ctx, sessions)
	if err != nil {
		return nil, 0, fmt.Errorf("bmdb: deleting expired sessions: %w", err)
	}
	return abandoned, deleted, nil
}

// TakeOver supersedes the expired session holder in tx: it locks the
// session row (SessionLockIfExpired: skipped if alive, gone, or being
// superseded by another transaction), ends all its claims as Abandoned and
// deletes it. It returns the processes of the claims ended, none if it
// skipped the session.
func TakeOver(ctx context.Context, tx *txn.Tx, holder uuid.UUID) ([]string, error) {
	_, err := tx.Store().SessionLockIfExpired(ctx, holder)
	if isNoRows(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bmdb: taking over from session %s: %w", holder, err)
	}
	abandoned, _, err := Supersede(ctx, tx, []uuid.UUID{holder})
	if err != nil {
		return nil, fmt.Errorf("bmdb: taking over from session %s: %w", holder, err)
	}
	return abandoned, nil
}
