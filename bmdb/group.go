package bmdb

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Concurrent claims (Work, WorkBatch) and ends (Finish, FinishWith, Cancel,
// Fail) of a session for one process are served by one transaction: a
// group (grouptx.go). A caller that finds no group running leads one: it
// runs the group's transaction, hands each member its own result,
// and passes the lead to the first caller that queued meanwhile. Every
// attempt of the transaction, once admitted (Config.ClaimConcurrency),
// first takes in whatever is queued, up to Config.MaxGroupSize. So groups
// form from what is waiting when the previous transaction ends: no timer
// adds latency at low load, and at high load one transaction serves many
// callers.

// member is one call waiting in a queue, with its request and result.
type member[R any] struct {
	req   R
	ctx   context.Context
	taken bool          // in a running group; guarded by queue.mu
	lead  chan struct{} // closed to make it lead the next group
	done  chan struct{} // closed when its group has run, or it was dropped
	err   error         // set instead of a result: its ctx ended before its group began, or its group panicked
}

// queue serialises the groups of one kind of call. The zero queue is
// ready; limit bounds a group.
type queue[R any] struct {
	limit int

	mu      sync.Mutex
	waiting []*member[R]
	busy    bool // a group is running, or its leader is about to run it
}

// do queues req and returns when a group holding it has run (run is called,
// by whichever caller leads, with that group's members, and must give each
// its result). A call whose ctx ends before its group begins returns ctx's
// cause without running; once its group has begun it waits for the outcome
// (the group's transaction is bounded by its own context).
func (q *queue[R]) do(ctx context.Context, req R, run func(g *group[R])) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	m := &member[R]{req: req, ctx: ctx, lead: make(chan struct{}), done: make(chan struct{})}
	q.mu.Lock()
	q.waiting = append(q.waiting, m)
	leading := !q.busy
	q.busy = true
	q.mu.Unlock()
	if !leading {
		select {
		case <-m.done:
			return m.err
		case <-m.lead:
		case <-ctx.Done():
			if err, gone := q.leave(m); gone {
				return err
			}
		}
	}
	q.runGroup(run)
	<-m.done
	return m.err
}

// leave removes m after its ctx ended, unless it is in a running group
// (then it waits for that group) or was just made leader (then it leads).
// It reports whether m left, with ctx's cause.
func (q *queue[R]) leave(m *member[R]) (error, bool) {
	q.mu.Lock()
	select {
	case <-m.lead:
		q.mu.Unlock()
		return nil, false
	default:
	}
	if m.taken {
		q.mu.Unlock()
		<-m.done
		return m.err, true
	}
	for i, w := range q.waiting {
		if w == m {
			q.waiting = append(q.waiting[:i:i], q.waiting[i+1:]...)
			break
		}
	}
	q.mu.Unlock()
	return context.Cause(m.ctx), true
}

// runGroup runs a group for the waiting members, then passes the lead on.
func (q *queue[R]) runGroup(run func(g *group[R])) {
	g := &group[R]{q: q}
	g.grow()
	defer func() {
		if p := recover(); p != nil {
			// A callback of one member panicked on this goroutine: the
			// others get an error, not a result of an attempt that did not
			// commit, and the panic goes on up the leader's stack.
			for _, m := range g.members {
				m.err = fmt.Errorf("%w: %v", errGroupPanicked, p)
			}
			defer panic(p)
		}
		for _, m := range g.members {
			close(m.done)
		}
		q.mu.Lock()
		defer q.mu.Unlock()
		if len(q.waiting) == 0 {
			q.busy = false
			return
		}
		close(q.waiting[0].lead)
	}()
	if len(g.members) > 0 {
		g.ctx, g.cancel = context.WithCancelCause(context.WithoutCancel(g.members[0].ctx))
		defer func() {
			if g.deadline != nil {
				g.deadline.Stop()
			}
			g.cancel(nil)
		}()
		for _, m := range g.members {
			g.bound(m.ctx)
		}
		run(g)
	}
}

// group is the members of one group transaction: those queued when it
// began, and those that joined at the start of a later attempt.
type group[R any] struct {
	q       *queue[R]
	members []*member[R]

	// ctx bounds the group's transaction: by the session (through
	// claimTransact), and by the latest deadline of its members' contexts
	// (none if one has none), but not by their cancellation: once it has
	// begun, a group runs for all of its members.
	ctx       context.Context
	cancel    context.CancelCauseFunc
	deadline  *time.Timer
	latest    time.Time
	unbounded bool
}

// grow moves the queued members into the group, up to the queue's limit,
// and returns all its members. Members whose ctx has ended are dropped
// instead, with ctx's cause. Once the group's context has ended, it takes
// no more.
func (g *group[R]) grow() []*member[R] {
	if g.ctx != nil && g.ctx.Err() != nil {
		return g.members
	}
	q := g.q
	q.mu.Lock()
	defer q.mu.Unlock()
	i := 0
	for ; i < len(q.waiting) && (q.limit <= 0 || len(g.members) < q.limit); i++ {
		m := q.waiting[i]
		if m.ctx.Err() != nil {
			m.taken = true
			m.err = context.Cause(m.ctx)
			close(m.done)
			continue
		}
		if g.ctx != nil {
			g.bound(m.ctx)
			if g.ctx.Err() != nil {
				// The group's deadline passed before it could cover
				// m's: m waits for the next group.
				break
			}
		}
		m.taken = true
		g.members = append(g.members, m)
	}
	q.waiting = append(q.waiting[:0:0], q.waiting[i:]...)
	return g.members
}

// bound extends the group's deadline to cover ctx's.
func (g *group[R]) bound(ctx context.Context) {
	if g.unbounded {
		return
	}
	d, ok := ctx.Deadline()
	switch {
	case !ok:
		g.unbounded = true
		if g.deadline != nil {
			g.deadline.Stop()
		}
	case g.deadline == nil:
		g.latest = d
		g.deadline = time.AfterFunc(time.Until(d), func() { g.cancel(context.DeadlineExceeded) })
	case d.After(g.latest):
		g.latest = d
		g.deadline.Reset(time.Until(d))
	}
}

// errGroupPanicked is the error of the members of a group whose
// transaction was cut short by a panic in a callback.
var errGroupPanicked = errors.New("bmdb: a callback of another call in the same group panicked")

// isolate reports whether the group's error should be retried member by
// member, to find which member caused it: an error of a callback or of a
// statement, not one of the session, the group's context, the retry budget
// or the connection, which would fail each member alike. A context error
// while the group's context is fine comes from a callback that used its
// own caller's context: that caller's error alone.
func (g *group[R]) isolate(err error) bool {
	switch {
	case err == nil, g.ctx.Err() != nil, errors.Is(err, ErrSessionExpired), errors.Is(err, ErrSessionClosed),
		errors.Is(err, ErrConnectionClosed), errors.Is(err, ErrRetriesExhausted),
		errors.Is(err, ErrAmbiguousCommit):
		return false
	}
	return true
}
