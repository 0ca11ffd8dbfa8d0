package bmdb

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// request is one Work, WorkMany, Finish, Cancel or Fail call, handed by
// its caller to the batcher of its process.
type request struct {
	ctx   context.Context // the caller's: it may leave while queued
	claim *claimRequest   // a Work or WorkMany; nil for an end
	end   *endRequest     // a Finish, Cancel or Fail; nil for a claim

	// Written by the batcher goroutine while the request is in a batch;
	// read by the caller once done is closed.
	suspect  bool  // one of its callbacks failed in the batch's last attempt
	panicked any   // what one of its callbacks panicked with, if one did
	err      error // the batch's error; the request's own outcome is in claim or end
	done     chan struct{}

	taken bool // in a batch, or replied to; guarded by batcher.mu
}

// batcher runs a session's claims and ends of one process. Callers
// enqueue a request and wait for their reply. Its goroutine (run) takes
// what is waiting, up to Config.MaxBatchSize, and hands it to a batch
// goroutine of its own, which runs one transaction for it (transact),
// applies the failure policy (settle), and replies to each; while batches
// run and calls wait, run starts further batches, up to
// Config.MaxConcurrentBatches at once. It exits when the session ends,
// after its batches.
type batcher struct {
	s          *Session
	process    string
	limit      int           // Config.MaxBatchSize
	maxRunning int           // Config.MaxConcurrentBatches
	wake       chan struct{} // capacity 1: a request was queued
	ended      chan struct{} // capacity maxRunning: a batch goroutine returned
	fences     *fencer       // creates the claim rows of candidates ahead of their claims
	controlled atomic.Bool   // the process's controls row is known to exist (ensureControls)
	lastSweep  atomic.Int64  // when a claim last swept the process's expired claims (sweepDue), in Unix nanoseconds

	running int // owned by run: batch goroutines not yet returned

	mu      sync.Mutex
	waiting []*request // guarded by mu: appended by callers, taken by run and by batches' attempts
	joining int        // guarded by mu: batches started whose first attempt has not yet joined
	closed  error      // guarded by mu: set when run exits, the reply of later requests
}

// batcher returns the batcher of process, started on first use.
func (s *Session) batcher(process string) *batcher {
	s.batchersMu.Lock()
	defer s.batchersMu.Unlock()
	b := s.batchers[process]
	if b == nil {
		if s.batchers == nil {
			s.batchers = map[string]*batcher{}
		}
		n := s.conn.cfg.MaxConcurrentBatches
		b = &batcher{
			s: s, process: process, limit: s.conn.cfg.MaxBatchSize, maxRunning: n,
			wake: make(chan struct{}, 1), ended: make(chan struct{}, n),
			fences: newFencer(s, process),
		}
		s.batchers[process] = b
		go b.run()
		go b.fences.run()
	}
	return b
}

// do hands r, a call for process, to its batcher and waits for the reply:
// the batch's error, or nil and r's own outcome. A call whose ctx ends
// while it is queued leaves with ctx's cause; once its batch has begun it
// waits for the outcome, which the session and the latest deadline of the
// batch's calls bound. If one of r's callbacks panicked, do panics with
// the same value, on the caller's goroutine.
func (s *Session) do(ctx context.Context, process string, r *request) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if err := s.alive(); err != nil {
		return err
	}
	r.ctx, r.done = ctx, make(chan struct{})
	b := s.batcher(process)
	b.mu.Lock()
	if b.closed != nil {
		b.mu.Unlock()
		return b.closed
	}
	b.waiting = append(b.waiting, r)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		if b.leave(r) {
			return context.Cause(ctx)
		}
		<-r.done
	}
	if r.panicked != nil {
		panic(r.panicked)
	}
	return r.err
}

// leave removes r from the queue after its caller's ctx ended, and reports
// whether it left; false means r is in a batch (or replied to): wait for
// the reply.
func (b *batcher) leave(r *request) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.taken {
		return false
	}
	for i, w := range b.waiting {
		if w == r {
			b.waiting = append(b.waiting[:i:i], b.waiting[i+1:]...)
			break
		}
	}
	return true
}

// sweepDue reports whether the next claim statement should find every
// claim of the process held by an expired session, not only those among
// its candidates (claimPass.run), and notes it: once every quarter of a
// session interval, so that a dead worker's claims of the process end
// about that soon after its deadline whatever the retrievals return, at
// the cost of reading the process's claims (work_process_idx) that often.
func (b *batcher) sweepDue() bool {
	now := time.Now().UnixNano()
	last := b.lastSweep.Load()
	return now-last >= int64(b.s.interval/4) && b.lastSweep.CompareAndSwap(last, now)
}

// run is the batcher's goroutine: it starts a batch goroutine for what is
// waiting whenever fewer than maxRunning run, and none is about to take
// what waits (start).
func (b *batcher) run() {
	for {
		select {
		case <-b.s.ctx.Done():
			b.close(context.Cause(b.s.ctx))
			for ; b.running > 0; b.running-- {
				<-b.ended
			}
			return
		case <-b.wake:
		case <-b.ended:
			b.running--
		}
		for b.running < b.maxRunning {
			reqs := b.start()
			if len(reqs) == 0 {
				break
			}
			b.running++
			go func() {
				defer func() { b.ended <- struct{}{} }()
				b.runBatch(reqs, true)
			}()
		}
	}
}

// close replies err to every queued request, and to every later one.
func (b *batcher) close(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = err
	for _, r := range b.waiting {
		r.taken, r.err = true, err
		close(r.done)
	}
	b.waiting = nil
}

// start dequeues the next batch (up to limit requests, in order), unless
// a batch that run started has not yet joined the requests waiting at its
// first attempt: those will join it, sharing its transaction rather than
// taking another connection.
func (b *batcher) start() []*request {
	b.mu.Lock()
	joining := b.joining
	b.mu.Unlock()
	if joining > 0 {
		return nil
	}
	reqs := b.join(nil, nil)
	if len(reqs) > 0 {
		b.mu.Lock()
		b.joining++
		b.mu.Unlock()
	}
	return reqs
}

// joined notes that a batch started by run has joined the waiting
// requests (or ended without), and wakes run for what still waits.
func (b *batcher) joined() {
	b.mu.Lock()
	b.joining--
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// join adds the waiting requests to reqs, in order, up to limit, and
// returns them. A batch joins at the start of each attempt of its
// transaction, so that calls that arrive while it begins share it; its
// bound then covers theirs, unless it has already ended. Requests whose
// ctx has ended are replied to with its cause instead.
func (b *batcher) join(bound *batchBound, reqs []*request) []*request {
	if bound != nil && bound.fresh {
		bound.fresh = false
		defer b.joined()
	}
	if bound != nil && bound.ctx.Err() != nil {
		return reqs
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	i := 0
	for ; i < len(b.waiting) && len(reqs) < b.limit; i++ {
		r := b.waiting[i]
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
	b.waiting = append(b.waiting[:0:0], b.waiting[i:]...)
	return reqs
}

// runBatch runs one transaction for reqs, which grows, if join, with the
// requests that join at the start of each of its attempts (attempt), and
// settles its outcome. Reruns that isolate requests do not take in new
// ones. After an ambiguous COMMIT the claims are resolved
// (resolveClaims): if any is held, the transaction committed, ends
// included.
func (b *batcher) runBatch(reqs []*request, join bool) {
	bound := newBatchBound(reqs)
	bound.fresh = join
	defer func() {
		if bound.fresh { // ended before its first attempt joined
			b.joined()
		}
	}()
	defer bound.stop()
	s := b.s
	ctx, stop := s.bound(bound.ctx)
	defer stop()
	var claims []*request
	err := s.alive()
	if c, _ := split(reqs); err == nil && len(c) > 0 && !b.controlled.Load() {
		// Before the first claim, so that its snapshot sees the row
		// (without it, the claim makes it and runs again).
		if s.ensureControls(ctx, b.process) == nil {
			b.controlled.Store(true)
		}
	}
	if err == nil {
		err = s.conn.transact(ctx, s.conn.batchTx, func(tx *Tx) error {
			// Requests join before the attempt's first statement: a
			// Finish of a claim that another batch committed must see it
			// in its snapshot.
			if join {
				reqs = b.join(bound, reqs)
			}
			var ends []*request
			claims, ends = split(reqs)
			return b.attempt(ctx, tx, claims, ends)
		})
	}
	if errors.Is(err, ErrAmbiguousCommit) && len(claims) > 0 {
		err = s.resolveClaims(ctx, b.process, claims, err) // nil: a claim is held, the transaction committed
	}
	b.settle(bound.ctx, reqs, err)
}

// batchBound is the context of a batch's transaction: bounded by the
// latest deadline of its requests' contexts (none if one has none), but
// not by their cancellation, since once it has begun a batch runs for all
// its requests. The session bounds it too (Session.transact). Owned by the
// batcher goroutine.
type batchBound struct {
	fresh     bool // started by run, and its first attempt has not joined yet
	ctx       context.Context
	cancel    context.CancelCauseFunc
	timer     *time.Timer // fires at latest; nil while unbounded or not yet bounded
	latest    time.Time
	unbounded bool
}

// newBatchBound returns the bound of a batch of reqs.
func newBatchBound(reqs []*request) *batchBound {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(reqs[0].ctx))
	bb := &batchBound{ctx: ctx, cancel: cancel}
	for _, r := range reqs {
		bb.cover(r.ctx)
	}
	return bb
}

// cover extends the bound to cover ctx's deadline.
func (bb *batchBound) cover(ctx context.Context) {
	if bb.unbounded {
		return
	}
	d, ok := ctx.Deadline()
	switch {
	case !ok:
		bb.unbounded = true
		if bb.timer != nil {
			bb.timer.Stop()
		}
	case bb.timer == nil:
		bb.latest = d
		bb.timer = time.AfterFunc(time.Until(d), func() { bb.cancel(context.DeadlineExceeded) })
	case d.After(bb.latest):
		bb.latest = d
		bb.timer.Reset(time.Until(d))
	}
}

// stop releases the bound's timer and context.
func (bb *batchBound) stop() {
	if bb.timer != nil {
		bb.timer.Stop()
	}
	bb.cancel(nil)
}

// attempt is one attempt of a batch's transaction: the claims first, right
// after the snapshot that their retrievals read (the session check follows
// the first claim statement), then the ends, then claims of the machines
// those ends freed, then the last check before COMMIT, which is the last
// claim or Finish statement's own if one of them came last (checks).
func (b *batcher) attempt(ctx context.Context, tx *Tx, claims, ends []*request) error {
	s := b.s
	for _, r := range claims {
		r.suspect, r.panicked = false, nil
	}
	for _, r := range ends {
		r.suspect, r.panicked = false, nil
	}
	c := &checks{}
	var cp *claimPass
	if len(claims) > 0 {
		cp = b.newClaimPass(claims, c)
		if err := cp.run(ctx, tx); err != nil {
			return err
		}
	}
	if !c.first {
		if err := s.check(ctx, tx); err != nil {
			return err
		}
		c.first = true
	}
	if len(ends) > 0 {
		freed, err := s.endInTx(ctx, tx, b.process, ends, c)
		if err != nil {
			return err
		}
		if cp != nil {
			if err := cp.claimFreed(ctx, tx, freed); err != nil {
				return err
			}
		}
	}
	return s.checkBeforeCommit(ctx, tx, c)
}

// settle is the failure policy: it replies to every request of a batch
// whose transaction returned err.
//   - Committed (nil), or an error that fails every request alike (the
//     session's, the batch's context, ambiguous): each gets it.
//   - Callbacks failed or panicked: their requests are the suspects. One
//     suspect gets the error; several (a SharedCommit's) run again one by
//     one. The other requests run again as a batch.
//   - A statement failed for a reason any request may have caused (a
//     constraint an application added, say): each runs again alone.
//   - Claims and ends ran out of retries together: the claims fail, the
//     ends run again as a batch of their own (ends free machines).
func (b *batcher) settle(ctx context.Context, reqs []*request, err error) {
	switch {
	case err == nil || len(reqs) == 1:
	case errors.Is(err, ErrRetriesExhausted):
		claims, ends := split(reqs)
		if len(claims) > 0 && len(ends) > 0 {
			b.reply(claims, err)
			b.runBatch(ends, false)
			return
		}
	case isolatable(ctx, err):
		var suspects, others []*request
		for _, r := range reqs {
			if r.suspect {
				suspects = append(suspects, r)
			} else {
				others = append(others, r)
			}
		}
		if len(suspects) == 0 {
			suspects, others = reqs, nil
		}
		if len(suspects) == 1 && len(others) > 0 {
			b.reply(suspects, err)
		} else {
			for _, r := range suspects {
				b.runBatch([]*request{r}, false)
			}
		}
		if len(others) > 0 {
			b.runBatch(others, false)
		}
		return
	}
	b.reply(reqs, err)
}

// isolatable reports whether err, a batch's error, may have been caused by
// one of its requests rather than by what they share: the session, the
// batch's context, the retry budget, the connection, the COMMIT. A context
// error while the batch's context is fine comes from a callback that used
// its own caller's context.
func isolatable(ctx context.Context, err error) bool {
	switch {
	case ctx.Err() != nil, errors.Is(err, ErrSessionExpired), errors.Is(err, ErrSessionClosed),
		errors.Is(err, ErrConnectionClosed), errors.Is(err, ErrRetriesExhausted),
		errors.Is(err, ErrAmbiguousCommit):
		return false
	}
	return true
}

// reply gives each of reqs err as the batch's outcome and wakes its caller.
func (b *batcher) reply(reqs []*request, err error) {
	for _, r := range reqs {
		r.err = err
		if err == nil && r.end != nil {
			b.s.recordEnd(r.end)
		}
		close(r.done)
	}
}

// callback runs fn, a callback of the application's for reqs (a retrieve,
// a commit, a SharedCommit), and marks reqs as suspects if it fails or
// panics. A panic is recovered here, on the batcher goroutine, and becomes
// an error that rolls the attempt back; do panics again on the caller's.
func callback(reqs []*request, fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			for _, r := range reqs {
				r.panicked = p
			}
			err = fmt.Errorf("%w: %v", errCallbackPanicked, p)
		}
		if err != nil {
			for _, r := range reqs {
				r.suspect = true
			}
		}
	}()
	return fn()
}

// errCallbackPanicked is the transaction error of a callback that panicked.
var errCallbackPanicked = errors.New("bmdb: callback panicked")

// split returns the claims and the ends of reqs.
func split(reqs []*request) (claims, ends []*request) {
	for _, r := range reqs {
		if r.claim != nil {
			claims = append(claims, r)
		} else {
			ends = append(ends, r)
		}
	}
	return claims, ends
}
