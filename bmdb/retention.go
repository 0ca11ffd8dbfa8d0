package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/txn"
)

// PruneHistoryBatchDefault is the batch size PruneHistory uses for batch 0.
const PruneHistoryBatchDefault = 1000

// MaxPruneHistoryBatch is the largest batch PruneHistory takes: one batch
// is one transaction, which on CockroachDB must reach its commit within
// Config.MaxTransactionDuration.
const MaxPruneHistoryBatch = 10000

// PruneHistory deletes work_history rows older than olderThan (on the
// database clock), oldest first, in transactions of at most batch rows
// (0: PruneHistoryBatchDefault), until none is left or ctx is done. Each
// batch commits on its own, with how far it got (work_history_retention),
// so an interrupted prune keeps what it did, and each batch, and each
// later run, starts where the last one got instead of stepping again over
// what it deleted (on CockroachDB deleted index entries stay for
// gc.ttlseconds). It returns the number of rows deleted, also alongside
// an error. It returns an error wrapping ErrInvalidArgument for olderThan
// not positive or batch outside [0, MaxPruneHistoryBatch], and
// ErrConnectionClosed after Close.
//
// History is the audit log: keep at least as long as operators investigate
// incidents. Run it from a cron job (bmdbctl history prune) or a component.
// On CockroachDB, row-level TTL on work_history (ttl_expiration_expression
// on at) is an alternative that needs no job (docs/cockroachdb.md).
func (c *Connection) PruneHistory(ctx context.Context, olderThan time.Duration, batch int) (int64, error) {
	switch {
	case olderThan <= 0:
		return 0, invalidArgument("PruneHistory: olderThan is %v, must be positive", olderThan)
	case batch < 0 || batch > MaxPruneHistoryBatch:
		return 0, invalidArgument("PruneHistory: batch is %d, must be in [0, %d]", batch, MaxPruneHistoryBatch)
	case batch == 0:
		batch = PruneHistoryBatchDefault
	}
	if c.closed() {
		return 0, ErrConnectionClosed
	}
	from, err := store.New(c.db).WorkHistoryPrunedBefore(dbconn.Own(ctx))
	if errors.Is(err, sql.ErrNoRows) {
		from, err = time.Time{}, nil
	}
	if err != nil {
		return 0, fmt.Errorf("bmdb: pruning history: reading how far retention got: %w", contextError(ctx, err))
	}
	var total int64
	for {
		var got store.WorkHistoryPruneRow
		err := c.runner.Run(ctx, txn.Serializable, nil, func(tx *txn.Tx) error {
			var err error
			got, err = tx.Store().WorkHistoryPrune(ctx, store.WorkHistoryPruneParams{
				FromAt: from, OlderThanSeconds: olderThan.Seconds(), BatchSize: int32(batch),
			})
			return err
		})
		if err != nil {
			return total, fmt.Errorf("bmdb: pruning history: %w", err)
		}
		total += got.Deleted
		if got.Deleted < int64(batch) {
			return total, nil
		}
		from = got.LastAt
	}
}
