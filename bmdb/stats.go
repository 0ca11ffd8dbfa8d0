package bmdb

import (
	"sync"
	"sync/atomic"

	"github.com/bmdb-dev/bmdb/internal/store"
)

// A Connection counts what it does once, in its counters: Stats reads
// them, and Metrics exports them, with labels, to Prometheus. The same
// numbers either way.

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
	st := &c.stats
	r := &st.retries
	s := Stats{
		TxAttempts:          st.attempts.Load(),
		TxRetries:           r[retrySerialization].Load() + r[retryLockTimeout].Load() + r[retryDeadlock].Load(),
		TxCommitRetries:     st.commitRetries.Load(),
		TxConnectionRetries: r[retryConnection].Load(),
		TxLockTimeouts:      r[retryLockTimeout].Load(),
		TxDeadlocks:         r[retryDeadlock].Load(),
		HeartbeatFailures:   st.heartbeatFailures.Load(),
	}
	st.eachProcess(func(_ string, p *processCounters) {
		s.ClaimCalls += p.calls.Load()
		s.ClaimsAsked += p.asked.Load()
		s.Claimed += p.claimed.Load()
		s.ClaimConflicts += p.conflicts.Load()
		s.ClaimNothingToDo += p.nothing.Load()
		s.ClaimPaused += p.paused.Load()
		s.ClaimCapped += p.capped.Load()
		s.ClaimsStale += p.stale.Load()
	})
	return s
}

// counters are a Connection's cumulative figures. Any goroutine updates
// them, atomically.
type counters struct {
	attempts          atomic.Int64
	commitRetries     atomic.Int64
	heartbeatFailures atomic.Int64
	sessionsStarted   atomic.Int64
	sessionsExpired   atomic.Int64
	retries           [retryReasons]atomic.Int64 // by retryReason

	mu        sync.Mutex
	processes map[string]*processCounters // guarded by mu; entries are never removed
}

// processCounters are a Connection's figures of one process.
type processCounters struct {
	calls, asked, claimed, conflicts, nothing, stale, backoffs atomic.Int64
	paused, capped                                             atomic.Int64
	// The process's controls at the last claim statement: pausedNow 1 or
	// 0, capNow the cap or 0; controlsSeen once one has run.
	pausedNow, capNow atomic.Int64
	controlsSeen      atomic.Bool
	events            [len(historyEvents)]atomic.Int64 // by historyEvents' index
}

// historyEvents are the events of work_history, in the order of
// processCounters.events.
var historyEvents = [...]store.WorkHistoryEvent{
	store.WorkHistoryEventStarted, store.WorkHistoryEventFinished, store.WorkHistoryEventFailed,
	store.WorkHistoryEventCanceled, store.WorkHistoryEventAbandoned, store.WorkHistoryEventBackoffCleared,
}

// process returns the counters of process, made on first use.
func (c *counters) process(process string) *processCounters {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.processes[process]
	if p == nil {
		if c.processes == nil {
			c.processes = map[string]*processCounters{}
		}
		p = &processCounters{}
		c.processes[process] = p
	}
	return p
}

// eachProcess calls fn with the counters of every process so far.
func (c *counters) eachProcess(fn func(process string, p *processCounters)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, p := range c.processes {
		fn(name, p)
	}
}

// event counts n work history events of process.
func (c *counters) event(process string, event store.WorkHistoryEvent) {
	p := c.process(process)
	for i, e := range historyEvents {
		if e == event {
			p.events[i].Add(1)
		}
	}
}

// events counts an event of each of processes.
func (c *counters) events(processes []string, event store.WorkHistoryEvent) {
	for _, p := range processes {
		c.event(p, event)
	}
}

// Reasons of retries, the index of counters.retries and the label of
// bmdb_transaction_retries_total.
type retryReason int

const (
	retrySerialization retryReason = iota
	retryLockTimeout
	retryDeadlock
	retryConnection
	retryReasons
)

func (r retryReason) String() string {
	return [...]string{"serialization", "lock_timeout", "deadlock", "connection"}[r]
}

// sawControls notes the controls a claim statement of the process found,
// for the gauges.
func (p *processCounters) sawControls(c controls) {
	paused := int64(0)
	if c.paused {
		paused = 1
	}
	p.pausedNow.Store(paused)
	p.capNow.Store(c.cap)
	p.controlsSeen.Store(true)
}
