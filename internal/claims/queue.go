package claims

import (
	"context"
	"sync"
	"sync/atomic"
)

// request is one call of Do, queued for a batch.
type request struct {
	ctx   context.Context // the caller's: it may leave while queued
	claim *ClaimCall      // nil for an end alone
	end   *EndCall        // nil for a claim alone

	// Written by the goroutine running the request's batch; read by the
	// caller once done is closed.
	suspect     bool  // one of its callbacks failed in the batch's last attempt
	claimFailed bool  // that callback was its retrieve
	claimDone   bool  // a call that also ends gave up its claim (ClaimCall.Err says why): it runs as an end
	panicked    any   // what one of its callbacks panicked with, if one did
	err         error // the batch's error; the call's own outcome is in claim and end
	batch       Batch // the last batch that ran it, for its span
	done        chan struct{}

	// promote is closed to make the caller run batches (queue.release);
	// taken and promoted are guarded by queue.mu.
	promote  chan struct{}
	taken    bool // in a batch, or replied to
	promoted bool
}

// queue is one process's calls of a session. Its batches run on the
// goroutines of its callers: at most maxRunning at once, each holding a
// runner's place, which a caller takes if one is free when it calls, or is
// handed by a runner that is done (release).
type queue struct {
	e       *Engine
	process string

	mu      sync.Mutex
	waiting []*request // guarded by mu: calls not yet in a batch, in order
	runners int        // guarded by mu: places taken

	lastSweep atomic.Int64 // when a claim last swept the process's expired claims (sweepDue), in Unix nanoseconds

	picks pickBook // what its batches running at once offer and claimed (picks.go)
}

// do queues r, runs batches if a runner's place is free or handed to it,
// and waits for r's reply.
func (q *queue) do(ctx context.Context, r *request) error {
	r.ctx, r.done, r.promote = ctx, make(chan struct{}), make(chan struct{})
	q.mu.Lock()
	q.waiting = append(q.waiting, r)
	run := q.runners < q.e.cfg.MaxConcurrentBatches
	if run {
		q.runners++
	}
	q.mu.Unlock()
	if run {
		q.run(r)
	}
	promote := r.promote // nil once acted on: a closed channel stays ready
	for waiting := true; waiting; {
		select {
		case <-r.done:
			waiting = false
		case <-promote:
			promote = nil
			q.run(r)
		case <-ctx.Done():
			if q.leave(r) {
				return context.Cause(ctx)
			}
			<-r.done
			waiting = false
		}
	}
	if r.panicked != nil {
		panic(r.panicked)
	}
	return r.err
}

// run runs batches of what waits, on the calling goroutine, in a runner's
// place, until r has its reply or is in another runner's batch, then
// hands the place on (release).
func (q *queue) run(r *request) {
	defer q.release()
	for {
		select {
		case <-r.done:
			return
		default:
		}
		reqs := q.join(nil, nil)
		if len(reqs) == 0 {
			return // r is in another batch
		}
		q.runBatch(reqs, true)
	}
}

// release gives the caller's runner's place to the first call that waits
// and is not in a batch, whose goroutine then runs batches (do), or frees
// it.
func (q *queue) release() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, w := range q.waiting {
		if !w.taken && !w.promoted {
			w.promoted = true
			close(w.promote)
			return
		}
	}
	q.runners--
}

// leave removes r from the queue after its caller's ctx ended, and reports
// whether it left; false means r is in a batch (or replied to): wait for
// the reply. A call that was handed a runner's place and leaves hands it
// on.
func (q *queue) leave(r *request) bool {
	q.mu.Lock()
	if r.taken {
		q.mu.Unlock()
		return false
	}
	for i, w := range q.waiting {
		if w == r {
			q.waiting = append(q.waiting[:i:i], q.waiting[i+1:]...)
			break
		}
	}
	r.taken = true
	promoted := r.promoted
	q.mu.Unlock()
	if promoted {
		q.release()
	}
	return true
}

// join adds the waiting calls to reqs, in order, up to MaxBatchSize, and
// returns them. A batch joins at the start of each attempt of its
// transaction, so that calls that arrive while it begins share it; bound,
// if not nil, then covers their deadlines, unless it has already ended.
// Calls whose ctx has ended are replied to with its cause instead.
func (q *queue) join(bound *batchBound, reqs []*request) []*request {
	if bound != nil && bound.ctx.Err() != nil {
		return reqs
	}
	limit := q.e.cfg.MaxBatchSize
	q.mu.Lock()
	defer q.mu.Unlock()
	i := 0
	for ; i < len(q.waiting) && len(reqs) < limit; i++ {
		r := q.waiting[i]
		r.taken = true
		if r.ctx.Err() != nil {
			r.err = context.Cause(r.ctx)
			close(r.done)
			continue
		}
		if bound != nil {
			bound.cover(r.ctx)
		}
		reqs = append(reqs, r)
	}
	q.waiting = append(q.waiting[:0:0], q.waiting[i:]...)
	return reqs
}
