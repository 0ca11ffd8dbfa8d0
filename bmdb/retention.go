package bmdb

import (
	"context"
	"fmt"
	"time"

	"github.com/bmdb-dev/bmdb/internal/store"
)

// PruneHistoryBatchDefault is the batch size PruneHistory uses for batch 0.
const PruneHistoryBatchDefault = 1000

// PruneHistory deletes work_history rows older than olderThan (on the
// database clock), oldest first, in transactions of at most batch rows
// (0: PruneHistoryBatchDefault), until none is left or ctx is done. Each
// batch commits on its own, so an interrupted prune keeps what it did. It
// returns the number of rows deleted, also alongside an error.
//
// History is the audit log: keep at least as long as operators investigate
// incidents. Run it from a cron job (bmdbctl history prune) or a component.
func (c *Connection) PruneHistory(ctx context.Context, olderThan time.Duration, batch int) (int64, error) {
	switch {
	case olderThan <= 0:
		return 0, invalidArgument("PruneHistory: olderThan is %v, must be positive", olderThan)
	case batch < 0 || batch > 1_000_000:
		return 0, invalidArgument("PruneHistory: batch is %d, must be in [0, 1000000]", batch)
	case batch == 0:
		batch = PruneHistoryBatchDefault
	}
	var total int64
	for {
		var n int64
		err := c.transact(ctx, serializable, func(tx *Tx) error {
			var err error
			n, err = tx.q.WorkHistoryPrune(ctx, store.WorkHistoryPruneParams{OlderThanSeconds: olderThan.Seconds(), BatchSize: int32(batch)})
			return err
		})
		if err != nil {
			return total, fmt.Errorf("bmdb: pruning history: %w", err)
		}
		total += n
		if n < int64(batch) {
			return total, nil
		}
	}
}
