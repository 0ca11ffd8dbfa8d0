package testdb

import (
	"sync/atomic"
	"testing"
	"time"
)

// probeTick is how often a DelayProbe asks to be woken.
const probeTick = 5 * time.Millisecond

// DelayProbe measures this process's scheduling delay while a timing test
// runs: a goroutine asks to be woken every probeTick and records how late
// it woke, the most so far. A test whose subject is timing adds a multiple
// of it to its bound, so that a loaded machine (other processes on the
// same cores, the race detector) widens the margin by what it actually
// cost, and an idle one keeps it tight.
type DelayProbe struct {
	worst atomic.Int64 // nanoseconds
	quit  chan struct{}
	done  chan struct{}
}

// StartDelayProbe starts a probe; it stops at the test's end if not
// before.
func StartDelayProbe(t testing.TB) *DelayProbe {
	p := &DelayProbe{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		timer := time.NewTimer(probeTick)
		defer timer.Stop()
		for {
			asked := time.Now()
			timer.Reset(probeTick)
			select {
			case <-p.quit:
				return
			case <-timer.C:
			}
			if late := time.Since(asked) - probeTick; late > time.Duration(p.worst.Load()) {
				p.worst.Store(int64(late))
			}
		}
	}()
	t.Cleanup(func() { p.Stop() })
	return p
}

// Worst returns the worst lateness seen so far.
func (p *DelayProbe) Worst() time.Duration { return time.Duration(p.worst.Load()) }

// Stop ends the probe (once) and returns the worst lateness it saw.
func (p *DelayProbe) Stop() time.Duration {
	select {
	case <-p.quit:
	default:
		close(p.quit)
	}
	<-p.done
	return p.Worst()
}
