package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/bmdb"
)

// A binary that runs several loops, the stages of a pipeline whose later
// stages retrieve what earlier ones finished, cannot let each loop stop
// when it is idle: a later stage is idle while an earlier one is still
// producing its input. RunAll runs them as a group that stops only when
// every loop is idle at once with nothing left it could do.
//
// How. At each idle poll a loop of a group tells the group what it found,
// as a loop alone decides whether to stop (see drain.go): idle, or ready
// (idle for StopWhenIdle, and either nothing of its process is left or
// DrainTimeout is over: where a loop alone would stop). Every other poll,
// and every claim, says busy. A ready loop does not stop: it polls on,
// and goes back to work when its input appears. The group keeps an epoch,
// bumped whenever a loop stops being idle; a loop's readiness rests on a
// count of its work left made at some epoch. Once every loop is ready the
// group begins a final round: it bumps the epoch and wakes every loop,
// which counts its work left again and, if none, confirms with one more
// claim. The group stops when every loop is ready at the round's epoch:
// no loop left idle since the round began, so each of the round's counts
// and claims ran after every machine any loop of the group finished.

// GroupLeftError is RunAll's error when its loops stopped together, idle,
// with work left in some of them: the *LeftError of each loop that had
// work left, in RunAll's order (see LeftError). errors.Is(err,
// ErrWorkLeft) reports it, and errors.As finds the first *LeftError.
type GroupLeftError struct {
	Left []*LeftError
}

func (e *GroupLeftError) Error() string {
	parts := make([]string, len(e.Left))
	for i, l := range e.Left {
		parts[i] = fmt.Sprintf("%s: %d machines in backoff, %d claimed by other sessions", l.Process, l.InBackoff, l.ClaimedByOthers)
	}
	return "worker: stopped when every stage was idle, with work left: " + strings.Join(parts, "; ")
}

// Unwrap returns the *LeftErrors.
func (e *GroupLeftError) Unwrap() []error {
	errs := make([]error, len(e.Left))
	for i, l := range e.Left {
		errs[i] = l
	}
	return errs
}

// RunAll runs loops together, each as Run runs it, in a group: the way
// to run the stages of a pipeline in one process. It returns when ctx is
// done (nil, after each loop's shutdown), when one loop meets an error
// that ends its Run (that error, which names its process, after every
// other loop shut down), or, if the loops have Config.StopWhenIdle, once
// every loop is idle at the same time (each for its own StopWhenIdle)
// and none of their processes has work left that it could do: nil if
// none has any left, otherwise, once each loop with work left has waited
// its DrainTimeout, a *GroupLeftError that counts it per loop. A loop
// that is idle while another is at work keeps polling, and goes back to
// work when its input appears. So nil, with StopWhenIdle, means that
// every machine any of the loops' retrievals proposed was processed, even
// one that a loop's work made the input of another.
//
// Either every loop has StopWhenIdle or none has. Each loop runs once: it
// must not have run, nor run again. RunAll returns an error wrapping
// bmdb.ErrInvalidArgument for no loops, a nil or repeated loop, or a mix
// of StopWhenIdle, and ErrAlreadyRunning for a loop that ran or runs.
func RunAll(ctx context.Context, loops ...*Loop) error {
	if err := checkGroup(loops); err != nil {
		return err
	}
	for i, l := range loops {
		if !l.started.CompareAndSwap(false, true) {
			for _, m := range loops[:i] {
				m.started.Store(false)
			}
			return fmt.Errorf("%w: worker.RunAll: loops[%d] (%s)", ErrAlreadyRunning, i, l.cfg.Process)
		}
	}
	groupCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	g := &group{stop: stop, round: -1, states: make([]memberState, len(loops))}
	for i, l := range loops {
		l.member = &member{g: g, i: i, wake: make(chan struct{}, 1)}
		g.members = append(g.members, l.member)
	}
	ran := make(chan error, len(loops))
	for _, l := range loops {
		go func() { ran <- l.run(groupCtx) }()
	}
	var first error
	for range loops {
		if err := <-ran; err != nil && first == nil {
			first = err
			stop(errStageEnded) // the other loops shut down
		}
	}
	if first != nil {
		return first
	}
	return g.outcome()
}

// errStageEnded is the cause of a group's end when one of its loops
// ended with an error: not that error, which would then be the cause of
// what the shutdown cut off in the other loops, and taken for theirs.
var errStageEnded = errors.New("worker: another loop of the group ended with an error")

func checkGroup(loops []*Loop) error {
	if len(loops) == 0 {
		return fmt.Errorf("%w: worker.RunAll: no loops", bmdb.ErrInvalidArgument)
	}
	seen := make(map[*Loop]int, len(loops))
	for i, l := range loops {
		if l == nil {
			return fmt.Errorf("%w: worker.RunAll: loops[%d] is nil", bmdb.ErrInvalidArgument, i)
		}
		if j, again := seen[l]; again {
			return fmt.Errorf("%w: worker.RunAll: loops[%d] and loops[%d] are the same Loop (%s)", bmdb.ErrInvalidArgument, j, i, l.cfg.Process)
		}
		seen[l] = i
		if first := loops[0]; (l.cfg.StopWhenIdle > 0) != (first.cfg.StopWhenIdle > 0) {
			return fmt.Errorf("%w: worker.RunAll: loops[0] (%s) has StopWhenIdle %v, loops[%d] (%s) %v: "+
				"a group stops when idle only if every loop has StopWhenIdle, and runs until its context is done only if none has",
				bmdb.ErrInvalidArgument, first.cfg.Process, first.cfg.StopWhenIdle, i, l.cfg.Process, l.cfg.StopWhenIdle)
		}
	}
	return nil
}

// group is RunAll's state: what each of its loops last said.
type group struct {
	stop    context.CancelCauseFunc // RunAll's: ends every loop's Run
	members []*member               // by loop, in RunAll's order

	mu      sync.Mutex    // guards what follows; the loops' claimers take it
	epoch   int64         // bumped when a loop stops being idle, and when a final round begins
	round   int64         // the epoch of the last final round begun (-1: none)
	states  []memberState // by loop
	stopped bool          // every loop was ready at the round's epoch: the group stopped
	left    []*LeftError  // when stopped: the loops' with work left
}

// member is a loop's place in its group: Loop.member, nil for a loop run
// alone (then every method does nothing). Its methods are called by the
// loop's claimer.
type member struct {
	g    *group
	i    int           // the loop's index in the group
	wake chan struct{} // capacity 1: the group asks the claimer to poll now (a final round)
}

// phase is what a loop last said to its group.
type phase int8

const (
	busy  phase = iota // claiming, at work, or unable to claim (paused, capped, an error)
	idle               // idle, not (yet) ready
	ready              // idle for StopWhenIdle, and done or done waiting
)

type memberState struct {
	phase phase
	cause error // when ready: errIdle (nothing left) or a *LeftError
	epoch int64 // when ready: the epoch of the count it rests on
}

// epoch returns the group's epoch, to go with a count of the work left.
func (m *member) epoch() int64 {
	if m == nil {
		return 0
	}
	m.g.mu.Lock()
	defer m.g.mu.Unlock()
	return m.g.epoch
}

// busy says that the loop is not idle: it claimed, has handlers at work,
// or cannot claim.
func (m *member) busy() {
	if m == nil {
		return
	}
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.states[m.i].phase != busy {
		g.epoch++ // what others counted may be out of date now
	}
	g.states[m.i] = memberState{phase: busy}
}

// idle says that the loop is idle, but not ready.
func (m *member) idle() {
	if m == nil {
		return
	}
	m.g.mu.Lock()
	defer m.g.mu.Unlock()
	m.g.states[m.i] = memberState{phase: idle}
}

// ready says that the loop is idle and done, with cause (errIdle or a
// *LeftError) from a count of its work left made at epoch. It reports
// whether the group stopped (every loop ready at its final round's
// epoch); if not, and every loop is ready, it begins a final round, or
// wakes the loops that have not counted in it yet.
func (m *member) ready(cause error, epoch int64) bool {
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return true
	}
	g.states[m.i] = memberState{phase: ready, cause: cause, epoch: epoch}
	for _, s := range g.states {
		if s.phase != ready {
			return false
		}
	}
	if g.round != g.epoch {
		g.epoch++
		g.round = g.epoch
	}
	current := true
	for i, s := range g.states {
		if s.epoch != g.epoch {
			current = false
			select {
			case g.members[i].wake <- struct{}{}:
			default:
			}
		}
	}
	if !current {
		return false
	}
	g.stopped = true
	for _, s := range g.states {
		var left *LeftError
		if errors.As(s.cause, &left) {
			g.left = append(g.left, left)
		}
	}
	klog.V(1).Infof("worker: every stage of the group idle, %d with work left; stopping", len(g.left))
	g.stop(errIdle)
	return true
}

// woken is what wakes the claimer to poll at once (nil: nothing).
func (m *member) woken() <-chan struct{} {
	if m == nil {
		return nil
	}
	return m.wake
}

// outcome is RunAll's result once every loop returned nil.
func (g *group) outcome() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.left) > 0 {
		return &GroupLeftError{Left: g.left}
	}
	return nil
}
