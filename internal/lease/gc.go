package lease

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/txn"
)

// Garbage collection deletes sessions that expired more than the grace
// period ago, after recording each of their claims as Abandoned. A pass
// lists them first, outside the transactions that delete
// (SessionListExpired: a scan of the sessions' primary index, on
// CockroachDB at follower_read_timestamp(), so that it neither waits for
// nor holds up any heartbeat), then locks and deletes them by primary key
// in transactions of up to gcBatch sessions, each committed on its own: a
// pass cut short by its budget keeps what it deleted, and the next pass
// lists what is left. The sessions table has no index on deadline: every
// heartbeat would move its session's entry, which on CockroachDB leaves a
// deleted entry for gc.ttlseconds (about 5.8 million for 1,000 sessions
// over 4 hours) that every scan of the index steps over.

// gcBatch bounds the sessions one GC transaction deletes: well within
// bmdb.Config.MaxTransactionDuration on CockroachDB, however many claims
// each session held.
const gcBatch = 100

// GCListLimit bounds the expired sessions one pass lists.
const GCListLimit = 10 * gcBatch

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

// Collector runs a Connection's garbage collection. Safe for concurrent
// use: every session of the Connection runs passes.
type Collector struct {
	Runner *txn.Runner
	// Grace is how long after its deadline an expired session is kept
	// (bmdb.Config.GCGracePeriod).
	Grace time.Duration
}

// Pass is one GC pass: it lists up to GCListLimit expired sessions and
// deletes them, gcBatch at a time, until they are gone or ctx ends. It
// returns how many it deleted and listed, the deletions also alongside an
// error (a batch whose COMMIT ctx cut is not counted, though it may have
// committed).
func (c *Collector) Pass(ctx context.Context) (deleted int64, listed int, _ error) {
	ids, bound, err := c.listExpired(ctx)
	if err != nil {
		return 0, 0, err
	}
	counters := c.Runner.Counters
	for batch := range chunks(ids, gcBatch) {
		var n int64
		var abandoned []string
		err := c.Runner.Run(ctx, txn.Serializable, nil, func(tx *txn.Tx) error {
			// What an attempt that failed to commit found is not this
			// attempt's: another collector may have deleted it since.
			n, abandoned = 0, nil
			locked, err := tx.Store().SessionLockExpired(ctx, store.SessionLockExpiredParams{SessionIds: batch, Before: bound})
			if err != nil {
				return fmt.Errorf("bmdb: locking expired sessions: %w", err)
			}
			abandoned, n, err = Supersede(ctx, tx, locked)
			return err
		})
		if err != nil {
			return deleted, len(ids), err
		}
		deleted += n
		counters.Events(abandoned, store.WorkHistoryEventAbandoned)
	}
	return deleted, len(ids), nil
}

// listExpired lists up to GCListLimit sessions expired more than the
// grace period ago, outside any transaction that writes (see above), with
// the bound they expired before.
func (c *Collector) listExpired(ctx context.Context) ([]uuid.UUID, time.Time, error) {
	db := c.Runner.DB
	q := store.New(db)
	bound, err := q.SessionExpiryBound(dbconn.Own(ctx), c.Grace.Seconds())
	if err != nil {
		return nil, bound, fmt.Errorf("bmdb: reading the expiry bound: %w", dbconn.ContextError(ctx, err))
	}
	arg := store.SessionListExpiredParams{Before: bound, RowLimit: GCListLimit}
	if !c.Runner.Cockroach {
		ids, err := q.SessionListExpired(dbconn.Own(ctx), arg)
		if err != nil {
			return nil, bound, fmt.Errorf("bmdb: listing expired sessions: %w", dbconn.ContextError(ctx, err))
		}
		return ids, bound, nil
	}
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, bound, fmt.Errorf("bmdb: listing expired sessions: %w", dbconn.ContextError(ctx, err))
	}
	defer func() { _ = tx.Rollback() }() // after Commit: a no-op
	if _, err := tx.ExecContext(ctx, sqlFollowerRead); err != nil {
		return nil, bound, fmt.Errorf("bmdb: listing expired sessions: %s: %w", sqlFollowerRead, dbconn.ContextError(ctx, err))
	}
	if _, err := tx.ExecContext(ctx, sqlAllowFullScans); err != nil {
		return nil, bound, fmt.Errorf("bmdb: listing expired sessions: %s: %w", sqlAllowFullScans, dbconn.ContextError(ctx, err))
	}
	ids, err := store.New(tx).SessionListExpired(dbconn.Own(ctx), arg)
	if err != nil {
		return nil, bound, fmt.Errorf("bmdb: listing expired sessions: %w", dbconn.ContextError(ctx, err))
	}
	return ids, bound, tx.Commit()
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
