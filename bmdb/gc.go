package bmdb

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/store"
)

// gcBatch bounds the sessions one GC transaction deletes.
const gcBatch = 1000

// gcFullPassPeriod is how often a Connection's periodic GC reads the whole
// of sessions_deadline_idx instead of its window.
const gcFullPassPeriod = time.Hour

// GC reads a window. Every heartbeat moves its session's entry in
// sessions_deadline_idx, and on CockroachDB each move leaves a deleted
// entry in the index for gc.ttlseconds (4 h by default), which a scan
// steps over: a read from the index's start up to the expiry bound would
// read every heartbeat of the fleet of those hours, on every pass of every
// session (docs/cockroachdb.md, "Hotspots"). No session's deadline is ever
// set below the expiry bound (SessionExpiryBound), so once a pass has
// deleted every session expired before its bound, a later pass need only
// read from that bound up: a window holding the heartbeats of about one
// GCPeriod. What it costs:
//
//   - A session whose deadline is moved below a bound by hand (UPDATE
//     sessions SET deadline = ...) is missed by the windows of the
//     Connections that passed that bound, until their next full pass (a
//     Connection's first periodic pass, then one every gcFullPassPeriod)
//     or a CollectGarbage, which always reads it all. Its claims are taken
//     over by Work meanwhile, as any expired session's.
//   - A full pass still steps over every deleted entry, once per
//     Connection when it starts and then hourly.
//   - Each GC transaction runs one statement more (the bound), and a
//     Connection keeps its bound in memory.
//
// The figures are in bench/README.md (BenchmarkGCDeadIndexEntries).

// gcWindow is a Connection's memory of its GC passes. Safe for concurrent
// use: every Session of the Connection runs GC.
type gcWindow struct {
	mu sync.Mutex
	// covered is the bound of the newest complete pass: no session whose
	// deadline is before it remained (database clock). Zero: no pass yet.
	covered time.Time
	// lastFull is when the last full pass began (monotonic clock).
	lastFull time.Time
}

// start returns where a pass reads from: the zero time for a full pass
// (full, no pass completed yet, or the last full one began more than
// gcFullPassPeriod ago), else covered.
func (w *gcWindow) start(full bool) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	if full || w.covered.IsZero() || time.Since(w.lastFull) > gcFullPassPeriod {
		w.lastFull = time.Now()
		return time.Time{}
	}
	return w.covered
}

// passed records a complete pass from from to bound.
func (w *gcWindow) passed(from, bound time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !from.After(w.covered) && bound.After(w.covered) {
		w.covered = bound
	}
}

// CollectGarbage deletes every session whose deadline passed more than
// Config.GCGracePeriod ago, first recording Abandoned history (with each
// claim's id) for each of their claims. It returns the number of sessions
// deleted. It works in transactions of up to gcBatch sessions, until none
// is left or ctx ends. It reads every expired session; the periodic GC of
// Sessions reads only those that expired since its last pass (gc.go).
//
// Every live Session runs it every Config.GCPeriod; operators may run it at
// any time. It is idempotent and safe to run from many components at once:
// concurrent runs serialise on the session rows (locked by primary key,
// reading only expired ones), and a claim is recorded Abandoned once. A
// takeover skips a session GC is deleting, and GC waits for a takeover
// (see SessionLockExpired). A transaction of an expired session still open
// on the server (a stalled client) may make GC wait, at most lock_timeout,
// and that session is then collected by a later run: on PostgreSQL it
// holds its session row with FOR KEY SHARE; on CockroachDB it holds
// intents on the rows it wrote.
func (c *Connection) CollectGarbage(ctx context.Context) (int64, error) {
	return c.collectGarbage(ctx, true)
}

// collectGarbage is one GC pass: over the window above the last complete
// pass's bound, or over every expired session if full (or due, gcWindow).
func (c *Connection) collectGarbage(ctx context.Context, full bool) (int64, error) {
	grace := c.cfg.GCGracePeriod.Seconds()
	from := c.gc.start(full)
	after := from
	var total int64
	for {
		var bound time.Time
		var expired []store.SessionListExpiredRow
		var deleted int64
		var abandoned []string
		err := c.transact(ctx, serializable, func(tx *Tx) error {
			// What an attempt that failed to commit found is not this
			// attempt's: another collector may have deleted it since.
			expired, deleted, abandoned = nil, 0, nil
			var err error
			if bound, err = tx.q.SessionExpiryBound(ctx, grace); err != nil {
				return fmt.Errorf("bmdb: reading the expiry bound: %w", err)
			}
			expired, err = tx.q.SessionListExpired(ctx, store.SessionListExpiredParams{After: after, Before: bound, RowLimit: gcBatch})
			if err != nil {
				return fmt.Errorf("bmdb: listing expired sessions: %w", err)
			}
			if len(expired) == 0 {
				return nil
			}
			ids := make([]uuid.UUID, len(expired))
			for i, x := range expired {
				ids[i] = x.SessionID
			}
			if ids, err = tx.q.SessionLockExpired(ctx, ids); err != nil {
				return fmt.Errorf("bmdb: locking expired sessions: %w", err)
			}
			abandoned, deleted, err = supersede(ctx, tx, ids)
			return err
		})
		if err != nil {
			return total, err
		}
		total += deleted
		c.stats.events(abandoned, store.WorkHistoryEventAbandoned)
		if len(expired) < gcBatch {
			c.gc.passed(from, bound)
			return total, nil
		}
		// Every session up to the last deadline listed is gone: the next
		// batch reads from there (its ties included).
		after = expired[len(expired)-1].Deadline
	}
}

// supersede deletes the given expired sessions, locked by tx, after ending
// their claims as Abandoned, and returns the processes of those claims and
// the number of sessions deleted. Deleting a session row is what orders a
// takeover or GC after every transaction of that session, which all read
// it, or aborts them. On PostgreSQL their read is a FOR KEY SHARE lock
// that the delete waits for. On CockroachDB it is a plain read (shared
// locks are off under SERIALIZABLE, and bmdb pins them off): the delete
// lands above the transaction's read timestamp, so the transaction either
// commits below it (serialized before the takeover) or, pushed above it,
// fails its read refresh with 40001 and its retry finds no session.
func supersede(ctx context.Context, tx *Tx, sessions []uuid.UUID) ([]string, int64, error) {
	if len(sessions) == 0 {
		return nil, 0, nil
	}
	abandoned, err := tx.q.WorkAbandonOfSessions(ctx, sessions)
	if err != nil {
		return nil, 0, fmt.Errorf("bmdb: abandoning work of expired sessions: %w", err)
	}
	deleted, err := tx.q.SessionDeleteMany(ctx, sessions)
	if err != nil {
		return nil, 0, fmt.Errorf("bmdb: deleting expired sessions: %w", err)
	}
	return abandoned, deleted, nil
}
