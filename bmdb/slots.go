package bmdb

import (
	"context"
	"sync"
)

// Priorities of claim transactions waiting for a slot: ending a claim
// (Finish, Cancel, Fail, ...) goes before taking a new one, so that a busy
// connection's claims do not starve the ends that would free machines.
const (
	priorityEnd = iota
	priorityClaim
	priorities
)

// slots is a counting semaphore with priorities, bounding a connection's
// concurrent claim transactions (Config.ClaimConcurrency). A nil *slots has
// no bound. Safe for concurrent use.
type slots struct {
	mu      sync.Mutex
	free    int
	waiting [priorities][]chan struct{}
}

func newSlots(n int) *slots { return &slots{free: n} }

// acquire takes a slot, waiting behind every waiter of the same or a higher
// priority, or returns ctx's cause if it ends first.
func (s *slots) acquire(ctx context.Context, priority int) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	if s.free > 0 && s.queued(priority) == 0 {
		s.free--
		s.mu.Unlock()
		return nil
	}
	granted := make(chan struct{})
	s.waiting[priority] = append(s.waiting[priority], granted)
	s.mu.Unlock()
	select {
	case <-granted:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-granted: // granted meanwhile: pass it on
		s.releaseLocked()
	default:
		q := s.waiting[priority]
		for i, ch := range q {
			if ch == granted {
				s.waiting[priority] = append(q[:i:i], q[i+1:]...)
				break
			}
		}
	}
	return context.Cause(ctx)
}

// queued counts waiters of priority p or higher.
func (s *slots) queued(p int) int {
	n := 0
	for q := 0; q <= p; q++ {
		n += len(s.waiting[q])
	}
	return n
}

// release returns a slot, handing it to the first waiter of the highest
// priority.
func (s *slots) release() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseLocked()
}

func (s *slots) releaseLocked() {
	for p := range s.waiting {
		if q := s.waiting[p]; len(q) > 0 {
			s.waiting[p] = q[1:]
			close(q[0])
			return
		}
	}
	s.free++
}
