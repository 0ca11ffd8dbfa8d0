package bmdb

import (
	"context"
	"fmt"

	"github.com/bmdb-dev/bmdb/model"
)

// CollectGarbage deletes, in one transaction, every session whose deadline
// passed more than Config.GCGracePeriod ago, first recording Abandoned
// history for each of their claims. It returns the number of sessions
// deleted.
//
// Every live Session runs it every Config.GCPeriod; operators may run it at
// any time. It is idempotent and safe to run from many components at once:
// concurrent runs serialise, and a claim is recorded Abandoned once.
func (c *Connection) CollectGarbage(ctx context.Context) (int64, error) {
	grace := c.cfg.GCGracePeriod.Seconds()
	var deleted int64
	var abandoned []string
	err := c.transact(ctx, func(tx *Tx) error {
		var err error
		abandoned, err = tx.q.WorkAbandonOfExpiredSessions(ctx, grace)
		if err != nil {
			return fmt.Errorf("bmdb: abandoning work of expired sessions: %w", err)
		}
		deleted, err = tx.q.SessionDeleteExpired(ctx, grace)
		if err != nil {
			return fmt.Errorf("bmdb: deleting expired sessions: %w", err)
		}
		return nil
	})
	if err == nil {
		c.metrics.workEvents(abandoned, model.WorkHistoryEventAbandoned)
	}
	return deleted, err
}
