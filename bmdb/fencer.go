package bmdb

import (
	"context"
	"fmt"
	"sync"

	"github.com/google/uuid"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/wait"
)

// A claim of (machine, process) locks the pair's work_fencing row, its
// claim row, and claims only pairs whose row exists (WorkClaimMany); the
// row is made before the pair's first claim, outside any claim
// transaction, so that no claim ever waits for another transaction's
// insert of it, and once per pair: the claim statement says which of its
// candidates have none. A fencer makes them for one session and process,
// in two ways:
//   - ahead: the candidates a claim statement found without a row, on the
//     fencer's goroutine, after the batch (ahead), so that the next batches
//     find them: a retrieval usually returns a machine several times before
//     it is claimed;
//   - on demand: a claim that found nothing but pairs without a row makes
//     them and runs again, once (claimPass.diagnose, ensure).
type fencer struct {
	s       *Session
	process string
	wake    chan struct{} // capacity 1: pending has ids

	mu      sync.Mutex
	pending []uuid.UUID        // guarded by mu: appended by ahead, taken by run
	known   map[uuid.UUID]bool // guarded by mu: machines queued (rows made, pending, or not machines)
}

// fencerMemory bounds a fencer's known machines; past it, it forgets them
// all (a forgotten machine is only looked up again).
const fencerMemory = 1 << 16

func newFencer(s *Session, process string) *fencer {
	return &fencer{s: s, process: process, wake: make(chan struct{}, 1), known: map[uuid.UUID]bool{}}
}

// ahead queues the machines of candidates (which a claim statement found
// without a row) not queued before, for the fencer's goroutine. Called by
// batch goroutines; it never waits.
func (f *fencer) ahead(candidates []uuid.UUID) {
	f.mu.Lock()
	n := len(f.pending)
	for _, m := range candidates {
		if !f.known[m] {
			if len(f.known) >= fencerMemory {
				clear(f.known)
			}
			f.known[m] = true
			f.pending = append(f.pending, m)
		}
	}
	added := len(f.pending) > n
	f.mu.Unlock()
	if added {
		select {
		case f.wake <- struct{}{}:
		default:
		}
	}
}

// run is the fencer's goroutine: it makes the rows of pending machines,
// MaxWorkMany at a time, until the session ends. A failure is logged and the
// machines forgotten: the claims that need their rows make them.
func (f *fencer) run() {
	for {
		select {
		case <-f.s.ctx.Done():
			return
		case <-f.wake:
		}
		for {
			f.mu.Lock()
			ids := f.pending[:min(len(f.pending), MaxWorkMany)]
			f.pending = f.pending[len(ids):]
			f.mu.Unlock()
			if len(ids) == 0 {
				break
			}
			ctx, cancel := context.WithTimeout(f.s.ctx, f.s.interval)
			err := f.ensure(ctx, ids)
			cancel()
			if err != nil {
				if f.s.ctx.Err() == nil {
					klog.V(1).Infof("bmdb: session %s: making claim rows of %d machines for %q ahead: %v", f.s.id, len(ids), f.process, err)
				}
				f.mu.Lock()
				for _, m := range ids {
					delete(f.known, m)
				}
				f.mu.Unlock()
			}
		}
	}
}

// ensureAttempts bounds the attempts of one statement run by autocommit.
const ensureAttempts = 3

// ensure makes the claim rows of the machines among ids that have none,
// with one statement outside any transaction (autocommit), bounded by ctx
// and the session.
func (f *fencer) ensure(ctx context.Context, ids []uuid.UUID) error {
	err := f.s.autocommit(ctx, func(ctx context.Context) error {
		_, err := f.s.conn.prepared.WorkFencingEnsure(ctx, store.WorkFencingEnsureParams{MachineIds: ids, Process: f.process})
		return err
	})
	if err != nil {
		return fmt.Errorf("making the claim rows of %d machines: %w", len(ids), err)
	}
	return nil
}

// autocommit runs stmt, one statement outside any transaction, bounded
// by ctx and the session, up to ensureAttempts times while it fails with
// a serialization failure (a concurrent statement making the same rows,
// on a server whose default isolation is SERIALIZABLE) or a lost
// connection.
func (s *Session) autocommit(ctx context.Context, stmt func(ctx context.Context) error) error {
	ctx, stop := s.bound(ctx)
	defer stop()
	var err error
	for attempt := 1; attempt <= ensureAttempts; attempt++ {
		err = stmt(ctx)
		if err == nil || ctx.Err() != nil || !(retryable(err) || isConnectionError(err)) {
			break
		}
		if werr := wait.Sleep(ctx, retryDelay(attempt)); werr != nil {
			break
		}
	}
	return contextError(ctx, err)
}
