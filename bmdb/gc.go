package bmdb

import (
	"context"
	"fmt"
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
	err := c.transact(ctx, func(tx *Tx) error {
		if _, err := tx.q.WorkAbandonOfExpiredSessions(ctx, grace); err != nil {
			return fmt.Errorf("bmdb: abandoning work of expired sessions: %w", err)
		}
		var err error
		deleted, err = tx.q.SessionDeleteExpired(ctx, grace)
		if err != nil {
			return fmt.Errorf("bmdb: deleting expired sessions: %w", err)
		}
		return nil
	})
	return deleted, err
}
