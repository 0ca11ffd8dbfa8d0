package bmdb

import (
	"fmt"
	"time"
)

// Transactions on CockroachDB have a wall-clock bound
// (Config.MaxTransactionDuration). A transaction's commit timestamp is
// pushed once it is older than the closed timestamp
// (kv.closed_timestamp.target_duration, 3 s by default): the range its
// commit writes to no longer accepts writes that old. A pushed transaction
// must refresh its reads, that is show that nothing it read changed
// between its read timestamp and the new one. Every session transaction
// reads its session's row, and the heartbeat rewrites that row every
// SessionInterval/2, so a session transaction older than the closed
// timestamp almost always fails its refresh (40001); a restart reads at a
// new timestamp, but runs as long, and fails again, until the attempts run
// out. bmdb therefore ends an attempt that outlived the bound with
// ErrTransactionTooLong, at once and without retrying it. PostgreSQL has
// no such push: there the bound is not applied.

// attemptDeadline bounds one attempt of a transaction on CockroachDB: the
// returned check, called when the attempt's callback is done (before its
// commit point), returns an error wrapping ErrTransactionTooLong if it ran
// longer than Config.MaxTransactionDuration.
func (c *Connection) attemptDeadline() (check func() error) {
	limit := c.cfg.MaxTransactionDuration
	if c.engine != engineCockroach || limit < 0 {
		return func() error { return nil }
	}
	start := time.Now()
	return func() error {
		if took := time.Since(start); took > limit {
			return fmt.Errorf("%w: the attempt ran %v before its commit, more than %v; on CockroachDB a transaction older than the closed timestamp (3 s by default) fails its read refresh on every attempt",
				ErrTransactionTooLong, took.Round(time.Millisecond), limit)
		}
		return nil
	}
}
