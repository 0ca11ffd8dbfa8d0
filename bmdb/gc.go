package bmdb

import (
	"context"

	"github.com/bmdb-dev/bmdb/internal/lease"
)

// CollectGarbage deletes every session whose deadline passed more than
// Config.GCGracePeriod ago, first recording Abandoned history (with each
// claim's id) for each of their claims. It returns the number of sessions
// deleted, also alongside an error: it lists expired sessions outside the
// transactions that delete (on CockroachDB at follower_read_timestamp()),
// and deletes them in batches that each commit on their own, until none is
// left or ctx ends. After Close it returns ErrConnectionClosed.
//
// Every live Session runs a pass every Config.GCPeriod; operators may run
// it at any time. It is idempotent and safe to run from many components at
// once: concurrent runs skip the sessions another holds (SKIP LOCKED), and
// a claim is recorded Abandoned once. A takeover and GC skip each other the
// same way. A session with a transaction still open on the server (a
// stalled client) may be skipped, and is collected by a later run once the
// server has ended that transaction (its idle timeout: one
// SessionInterval).
func (c *Connection) CollectGarbage(ctx context.Context) (int64, error) {
	if c.closed() {
		return 0, ErrConnectionClosed
	}
	var total int64
	for {
		n, listed, err := c.collector.Pass(ctx)
		total += n
		if err != nil || listed < lease.GCListLimit || n == 0 {
			return total, err
		}
	}
}
