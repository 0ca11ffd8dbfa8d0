package txn

import (
	"fmt"
	"time"
)

// Transactions on CockroachDB have a wall-clock bound (MaxAttemptDuration,
// bmdb.Config.MaxTransactionDuration). A transaction that writes once it
// is older than the closed timestamp (kv.closed_timestamp.target_duration,
// 3 s by default) is pushed to about now - 3 s and must refresh its reads;
// every session transaction read its session's row, which the heartbeat
// rewrites every SessionInterval/2, so the refresh fails (40001) if a
// heartbeat landed in between: the longer the transaction, the likelier,
// and a restart runs as long (docs/cockroachdb.md, "Transactions must be
// short"). So an attempt that outlived the bound ends with
// ErrTransactionTooLong, at once and without a retry. PostgreSQL has no
// such push: there the bound is not applied.

// attemptDeadline bounds one attempt on CockroachDB: the returned check,
// called when the attempt's body and its last session check are done
// (before its commit point), returns an error wrapping
// ErrTransactionTooLong if they ran longer than MaxAttemptDuration.
func (r *Runner) attemptDeadline() (check func() error) {
	limit := r.MaxAttemptDuration
	if !r.Cockroach || limit < 0 {
		return func() error { return nil }
	}
	start := time.Now()
	return func() error {
		if took := time.Since(start); took > limit {
			return fmt.Errorf("%w: the attempt ran %v before its commit, more than %v; on CockroachDB a transaction older than the closed timestamp (3 s by default) is pushed and fails its read refresh if a heartbeat landed meanwhile",
				ErrTransactionTooLong, took.Round(time.Millisecond), limit)
		}
		return nil
	}
}
