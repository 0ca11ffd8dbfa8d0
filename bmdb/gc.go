package bmdb

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/store"
)

// gcBatch bounds the sessions one GC transaction deletes.
const gcBatch = 1000

// CollectGarbage deletes every session whose deadline passed more than
// Config.GCGracePeriod ago, first recording Abandoned history (with each
// claim's id) for each of their claims. It returns the number of sessions
// deleted. It works in transactions of up to gcBatch sessions, until none
// is left or ctx ends.
//
// Every live Session runs it every Config.GCPeriod; operators may run it at
// any time. It is idempotent and safe to run from many components at once:
// concurrent runs serialise on the session rows (locked in deadline order,
// reading only expired ones), and a claim is recorded Abandoned once. A
// transaction of an expired session still open on the server (a stalled
// client) may make GC wait, at most lock_timeout, and that session is then
// collected by a later run: on PostgreSQL it holds its session row with
// FOR KEY SHARE; on CockroachDB it holds intents on the rows it wrote.
func (c *Connection) CollectGarbage(ctx context.Context) (int64, error) {
	grace := c.cfg.GCGracePeriod.Seconds()
	var total int64
	for {
		var deleted int64
		var abandoned []string
		err := c.transact(ctx, serializable, func(tx *Tx) error {
			ids, err := tx.q.SessionLockExpired(ctx, store.SessionLockExpiredParams{GraceSeconds: grace, RowLimit: gcBatch})
			if err != nil {
				return fmt.Errorf("bmdb: locking expired sessions: %w", err)
			}
			abandoned, deleted, err = supersede(ctx, tx, ids)
			return err
		})
		if err != nil {
			return total, err
		}
		total += deleted
		c.stats.events(abandoned, store.WorkHistoryEventAbandoned)
		if deleted < gcBatch {
			return total, nil
		}
	}
}

// supersede deletes the given expired sessions, locked by tx, after ending
// their claims as Abandoned, and returns the processes of those claims and
// the number of sessions deleted. Deleting a session row is what orders a
// takeover or GC after every transaction of that session, which all read
// it, or aborts them. On PostgreSQL their read is a FOR KEY SHARE lock
// that the delete waits for. On CockroachDB it is a plain read (shared
// locks are off under SERIALIZABLE, and bmdb pins them off): the delete
// lands above the transaction's read timestamp, so the transaction either
// commits below it (serialized before the takeover) or, pushed above it,
// fails its read refresh with 40001 and its retry finds no session.
func supersede(ctx context.Context, tx *Tx, sessions []uuid.UUID) ([]string, int64, error) {
	if len(sessions) == 0 {
		return nil, 0, nil
	}
	abandoned, err := tx.q.WorkAbandonOfSessions(ctx, sessions)
	if err != nil {
		return nil, 0, fmt.Errorf("bmdb: abandoning work of expired sessions: %w", err)
	}
	deleted, err := tx.q.SessionDeleteMany(ctx, sessions)
	if err != nil {
		return nil, 0, fmt.Errorf("bmdb: deleting expired sessions: %w", err)
	}
	return abandoned, deleted, nil
}
