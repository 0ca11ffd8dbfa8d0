// Package counters holds a Connection's cumulative figures, counted once
// by the room that does the work (transaction attempts and retries by the
// runner, heartbeats and sessions by the lease, claims and events by the
// batch engine) and read by bmdb's Stats and Metrics, the same numbers
// either way. Any goroutine updates them, atomically.
package counters

import (
	"sync"
	"sync/atomic"

	"github.com/bmdb-dev/bmdb/internal/store"
)

// Counters are one Connection's figures.
type Counters struct {
	Attempts          atomic.Int64 // transaction attempts
	CommitRetries     atomic.Int64 // retries whose error came from COMMIT
	HeartbeatFailures atomic.Int64
	SessionsStarted   atomic.Int64
	SessionsExpired   atomic.Int64
	Retries           [RetryReasons]atomic.Int64 // by RetryReason

	mu        sync.Mutex
	processes map[string]*Process // guarded by mu; entries are never removed
}

// Process are a Connection's figures of one process.
type Process struct {
	Calls, Asked, Claimed, Conflicts, Nothing, Stale, Backoffs atomic.Int64
	Paused, Capped                                             atomic.Int64
	// The process's controls at the last claim statement: PausedNow 1 or
	// 0, CapNow the cap or 0; ControlsSeen once one has run.
	PausedNow, CapNow atomic.Int64
	ControlsSeen      atomic.Bool
	Events            [len(HistoryEvents)]atomic.Int64 // by HistoryEvents' index
}

// HistoryEvents are the events of work_history, in the order of
// Process.Events.
var HistoryEvents = [...]store.WorkHistoryEvent{
	store.WorkHistoryEventStarted, store.WorkHistoryEventFinished, store.WorkHistoryEventFailed,
	store.WorkHistoryEventCanceled, store.WorkHistoryEventAbandoned, store.WorkHistoryEventBackoffCleared,
}

// Process returns the counters of process, made on first use.
func (c *Counters) Process(process string) *Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.processes[process]
	if p == nil {
		if c.processes == nil {
			c.processes = map[string]*Process{}
		}
		p = &Process{}
		c.processes[process] = p
	}
	return p
}

// EachProcess calls fn with the counters of every process so far.
func (c *Counters) EachProcess(fn func(process string, p *Process)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, p := range c.processes {
		fn(name, p)
	}
}

// Event counts a work history event of process.
func (c *Counters) Event(process string, event store.WorkHistoryEvent) {
	p := c.Process(process)
	for i, e := range HistoryEvents {
		if e == event {
			p.Events[i].Add(1)
		}
	}
}

// Events counts an event of each of processes.
func (c *Counters) Events(processes []string, event store.WorkHistoryEvent) {
	for _, p := range processes {
		c.Event(p, event)
	}
}

// SawControls notes the controls a claim statement of the process found,
// for the gauges.
func (p *Process) SawControls(paused bool, cap int64) {
	n := int64(0)
	if paused {
		n = 1
	}
	p.PausedNow.Store(n)
	p.CapNow.Store(cap)
	p.ControlsSeen.Store(true)
}

// RetryReason is why a transaction attempt was retried: the index of
// Counters.Retries and the label of bmdb_transaction_retries_total.
type RetryReason int

// Reasons of retries.
const (
	RetrySerialization RetryReason = iota
	RetryLockTimeout
	RetryDeadlock
	RetryConnection
	RetryReasons
)

func (r RetryReason) String() string {
	return [...]string{"serialization", "lock_timeout", "deadlock", "connection"}[r]
}
