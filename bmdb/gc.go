package bmdb

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/store"
)

// Garbage collection deletes sessions that expired more than
// Config.GCGracePeriod ago, after recording each of their claims as
// Abandoned. A pass lists them first, outside the transactions that
// delete (SessionListExpired: a scan of the sessions' primary index, on
// CockroachDB at follower_read_timestamp(), so that it neither waits for
// nor holds up any heartbeat), then locks and deletes them by primary key
// in transactions of up to gcBatch sessions, each committed on its own:
// a pass cut short by its budget keeps what it deleted, and the next
// pass lists what is left. The sessions table has no index on deadline:
// every heartbeat would move its session's entry, which on CockroachDB
// leaves a deleted entry for gc.ttlseconds (about 5.8 million for 1,000
// sessions over 4 hours) that every scan of the index steps over.

// gcBatch bounds the sessions one GC transaction deletes: well within
// Config.MaxTransactionDuration on CockroachDB, however many claims each
// session held.
const gcBatch = 100

// gcListLimit bounds the expired sessions one pass lists.
const gcListLimit = 10 * gcBatch

// On CockroachDB the listing runs in a read-only transaction at
// follower_read_timestamp() (about 4.8 s ago, served by any replica
// without waiting for writers), with disallow_full_table_scans lifted for
// it alone: it scans the sessions table by design, and a role that set the
// guardrail for its own queries must not stop bmdb's GC. PostgreSQL has
// neither statement, nor needs them.
const (
	sqlFollowerRead   = "SET TRANSACTION AS OF SYSTEM TIME follower_read_timestamp()"
	sqlAllowFullScans = "SET LOCAL disallow_full_table_scans = off"
)

// CollectGarbage deletes every session whose deadline passed more than
// Config.GCGracePeriod ago, first recording Abandoned history (with each
// claim's id) for each of their claims. It returns the number of sessions
// deleted, also alongside an error: each batch of up to gcBatch sessions
// commits on its own, until none is left or ctx ends. After Close it
// returns ErrConnectionClosed.
//
// Every live Session runs a pass every Config.GCPeriod; operators may run
// it at any time. It is idempotent and safe to run from many components at
// once: concurrent runs skip the sessions another holds (SKIP LOCKED), and
// a claim is recorded Abandoned once. A takeover and GC skip each other
// the same way (SessionLockExpired). A session with a transaction still
// open on the server (a stalled client) may be skipped, and is collected
// by a later run once the server has ended that transaction (its idle
// timeout: one SessionInterval).
func (c *Connection) CollectGarbage(ctx context.Context) (int64, error) {
	if c.closed.Load() {
		return 0, ErrConnectionClosed
	}
	var total int64
	for {
		n, listed, err := c.collectGarbage(ctx)
		total += n
		if err != nil || listed < gcListLimit || n == 0 {
			return total, err
		}
	}
}

// collectGarbage is one GC pass: it lists up to gcListLimit expired
// sessions and deletes them, gcBatch at a time, until they are gone or ctx
// ends. It returns how many it deleted and listed.
func (c *Connection) collectGarbage(ctx context.Context) (deleted int64, listed int, _ error) {
	ids, err := c.listExpired(ctx)
	if err != nil {
		return 0, 0, err
	}
	bound := ids.bound
	for batch := range chunks(ids.ids, gcBatch) {
		var n int64
		var abandoned []string
		err := c.transact(ctx, serializable, func(tx *Tx) error {
			// What an attempt that failed to commit found is not this
			// attempt's: another collector may have deleted it since.
			n, abandoned = 0, nil
			locked, err := tx.q.SessionLockExpired(ctx, store.SessionLockExpiredParams{SessionIds: batch, Before: bound})
			if err != nil {
				return fmt.Errorf("bmdb: locking expired sessions: %w", err)
			}
			abandoned, n, err = supersede(ctx, tx, locked)
			return err
		})
		if err != nil {
			return deleted, len(ids.ids), err
		}
		deleted += n
		c.stats.events(abandoned, store.WorkHistoryEventAbandoned)
	}
	return deleted, len(ids.ids), nil
}

// expiredList is what a GC pass lists: the sessions expired before bound.
type expiredList struct {
	ids   []uuid.UUID
	bound time.Time
}

// listExpired lists up to gcListLimit sessions expired more than the grace
// period ago, outside any transaction that writes (see above).
func (c *Connection) listExpired(ctx context.Context) (expiredList, error) {
	var l expiredList
	var err error
	if l.bound, err = c.prepared.SessionExpiryBound(ctx, c.cfg.GCGracePeriod.Seconds()); err != nil {
		return l, fmt.Errorf("bmdb: reading the expiry bound: %w", contextError(ctx, err))
	}
	arg := store.SessionListExpiredParams{Before: l.bound, RowLimit: gcListLimit}
	if c.engine != engineCockroach {
		l.ids, err = c.prepared.SessionListExpired(ctx, arg)
		if err != nil {
			return l, fmt.Errorf("bmdb: listing expired sessions: %w", contextError(ctx, err))
		}
		return l, nil
	}
	tx, err := c.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return l, fmt.Errorf("bmdb: listing expired sessions: %w", contextError(ctx, err))
	}
	defer func() { _ = tx.Rollback() }() // after Commit: a no-op
	if _, err := tx.ExecContext(ctx, sqlFollowerRead); err != nil {
		return l, fmt.Errorf("bmdb: listing expired sessions: %s: %w", sqlFollowerRead, contextError(ctx, err))
	}
	if _, err := tx.ExecContext(ctx, sqlAllowFullScans); err != nil {
		return l, fmt.Errorf("bmdb: listing expired sessions: %s: %w", sqlAllowFullScans, contextError(ctx, err))
	}
	if l.ids, err = store.New(tx).SessionListExpired(ctx, arg); err != nil {
		return l, fmt.Errorf("bmdb: listing expired sessions: %w", contextError(ctx, err))
	}
	return l, tx.Commit()
}

// chunks yields ids in slices of at most n.
func chunks(ids []uuid.UUID, n int) func(yield func([]uuid.UUID) bool) {
	return func(yield func([]uuid.UUID) bool) {
		for len(ids) > 0 {
			k := min(n, len(ids))
			if !yield(ids[:k]) {
				return
			}
			ids = ids[k:]
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
