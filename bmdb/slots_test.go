package bmdb

import (
	"context"
	"errors"
	"testing"
	"time"
)

// waiters counts the queued waiters of s.
func (s *slots) waiters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queued(priorities - 1)
}

func TestSlotsPriorityAndCancellation(t *testing.T) {
	t.Parallel()
	s := newSlots(1)
	ctx := context.Background()
	if err := s.acquire(ctx, priorityClaim); err != nil {
		t.Fatal(err)
	}
	order := make(chan string, 3)
	enqueue := func(name string, priority int) {
		before := s.waiters()
		go func() {
			if err := s.acquire(ctx, priority); err != nil {
				order <- "error " + err.Error()
				return
			}
			order <- name
		}()
		eventually(t, 5*time.Second, name+" queued", func() bool { return s.waiters() == before+1 })
	}
	enqueue("claim-1", priorityClaim)
	enqueue("claim-2", priorityClaim)
	enqueue("end", priorityEnd)

	// A waiter that gives up leaves the queue and leaks nothing.
	gone, cancel := context.WithCancelCause(ctx)
	errGone := errors.New("caller gave up")
	result := make(chan error, 1)
	go func() { result <- s.acquire(gone, priorityEnd) }()
	eventually(t, 5*time.Second, "the fourth waiter", func() bool { return s.waiters() == 4 })
	cancel(errGone)
	if err := <-result; !errors.Is(err, errGone) {
		t.Fatalf("cancelled acquire = %v", err)
	}

	var got []string
	for range 3 {
		s.release()
		got = append(got, <-order)
	}
	if !slicesEqual(got, "end", "claim-1", "claim-2") {
		t.Errorf("grant order %v, want the end first, then claims in arrival order", got)
	}
	s.release()
	if s.free != 1 || s.waiters() != 0 {
		t.Errorf("after all releases: %d free, %d waiting; want 1, 0", s.free, s.waiters())
	}
	var unbounded *slots
	if err := unbounded.acquire(ctx, priorityClaim); err != nil {
		t.Error(err)
	}
	unbounded.release()
}
