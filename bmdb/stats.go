package bmdb

import "github.com/bmdb-dev/bmdb/internal/counters"

// A Connection counts what it does once, in its counters (package
// counters, which the rooms that do the work update): Stats reads them,
// and Metrics exports them, with labels, to Prometheus. The same numbers
// either way.

// Stats are cumulative figures of a Connection, for tests and operators;
// Metrics exports the same numbers.
type Stats struct {
	// TxAttempts counts transaction attempts, first tries and retries.
	TxAttempts int64
	// TxRetries counts attempts that failed with a serialization error (or
	// a lock timeout, or a cached statement gone stale) and were retried.
	TxRetries int64
	// TxCommitRetries counts the TxRetries whose error came from COMMIT.
	TxCommitRetries int64
	// TxConnectionRetries counts attempts retried because the connection
	// failed before COMMIT (the server rolled them back).
	TxConnectionRetries int64
	// TxLockTimeouts counts the TxRetries whose error was a lock timeout
	// (55P03): the transaction waited lock_timeout for another one.
	TxLockTimeouts int64
	// TxDeadlocks counts the TxRetries whose error was a deadlock (40P01).
	TxDeadlocks int64
	// HeartbeatFailures counts failed heartbeat attempts.
	HeartbeatFailures int64

	// ClaimCalls counts the Work and WorkMany calls that claimed, or
	// returned ErrWorkConflict or ErrNothingToDo.
	ClaimCalls int64
	// ClaimsAsked counts the machines those calls asked for (their limits).
	ClaimsAsked int64
	// Claimed counts the machines they claimed.
	Claimed int64
	// ClaimConflicts counts the calls that returned ErrWorkConflict: their
	// candidates were claimed, or being claimed, by other sessions. A
	// process that keeps getting them while others claim is losing its
	// candidates to them.
	ClaimConflicts int64
	// ClaimNothingToDo counts the calls that returned ErrNothingToDo, and
	// neither ErrProcessPaused nor ErrCapReached.
	ClaimNothingToDo int64
	// ClaimPaused counts the calls that returned ErrProcessPaused.
	ClaimPaused int64
	// ClaimCapped counts the calls that returned ErrCapReached.
	ClaimCapped int64
	// ClaimsStale counts claim statements that met a candidate another
	// transaction had claimed or ended after the claiming transaction's
	// snapshot (PostgreSQL at snapshot isolation: first committer wins): the
	// attempt ran again with a new snapshot, at once the first times. They
	// are not among TxRetries.
	ClaimsStale int64
}

// Stats returns the connection's cumulative figures.
func (c *Connection) Stats() Stats {
	st := c.counters
	r := &st.Retries
	s := Stats{
		TxAttempts:          st.Attempts.Load(),
		TxRetries:           r[counters.RetrySerialization].Load() + r[counters.RetryLockTimeout].Load() + r[counters.RetryDeadlock].Load(),
		TxCommitRetries:     st.CommitRetries.Load(),
		TxConnectionRetries: r[counters.RetryConnection].Load(),
		TxLockTimeouts:      r[counters.RetryLockTimeout].Load(),
		TxDeadlocks:         r[counters.RetryDeadlock].Load(),
		HeartbeatFailures:   st.HeartbeatFailures.Load(),
	}
	st.EachProcess(func(_ string, p *counters.Process) {
		s.ClaimCalls += p.Calls.Load()
		s.ClaimsAsked += p.Asked.Load()
		s.Claimed += p.Claimed.Load()
		s.ClaimConflicts += p.Conflicts.Load()
		s.ClaimNothingToDo += p.Nothing.Load()
		s.ClaimPaused += p.Paused.Load()
		s.ClaimCapped += p.Capped.Load()
		s.ClaimsStale += p.Stale.Load()
	})
	return s
}
