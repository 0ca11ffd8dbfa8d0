package claims

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/lease"
	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/txn"
)

// runBatch runs one transaction for reqs, which grows, if join, with the
// calls that join at the start of each of its attempts, and settles its
// outcome. Reruns that isolate calls do not take in new ones. After an
// ambiguous COMMIT the claims are resolved (resolveClaims): if any is
// held, the transaction committed, ends included.
func (q *queue) runBatch(reqs []*request, join bool) {
	bound := newBatchBound(reqs)
	defer bound.stop()
	e := q.e
	spanCtx, span := q.startBatch(bound.ctx, reqs)
	ctx, stop := e.lease.Bound(spanCtx)
	defer stop()
	var claims []*request
	tok := &pickToken{}
	defer q.picks.release(tok) // also if a bug's panic ends the batch (callbacks' are caught)
	// Once due, every attempt of the batch sweeps (sweepDue): a sweep
	// whose attempt failed, say in a serialization conflict with the
	// claims it read, found nothing that counts.
	sweep := false
	attempts, err := e.runner.RunCounted(ctx, e.cfg.Isolation, e.lease, func(tx *txn.Tx) error {
		// Calls join before the attempt's first statement: a Finish of a
		// claim that another batch committed must see it in its snapshot.
		if join {
			n := len(reqs)
			reqs = q.join(bound, reqs)
			linkJoined(span, reqs, n)
		}
		var ends []*request
		claims, ends = split(reqs)
		q.picks.begin(tok)
		if len(claims) > 0 && !sweep {
			sweep = q.sweepDue()
		}
		return q.attempt(ctx, tx, tok, claims, ends, sweep)
	})
	if errors.Is(err, txn.ErrAmbiguousCommit) && len(claims) > 0 {
		err = q.resolveClaims(ctx, claims, err) // nil: a claim is held, the transaction committed
	}
	if err == nil {
		// Noted before its offers are released, so that no attempt whose
		// snapshot predates the commit offers them in between.
		var claimed []uuid.UUID
		for _, r := range claims {
			for _, c := range r.claim.Claims {
				claimed = append(claimed, c.Machine)
			}
		}
		q.picks.committed(claimed)
	}
	q.picks.release(tok)
	endBatch(span, reqs, attempts, err)
	for _, r := range reqs {
		r.batch = Batch{Span: span.SpanContext(), Attempts: attempts}
	}
	q.settle(bound.ctx, reqs, err)
}

// attempt is one attempt of a batch's transaction: the claims first, right
// after the snapshot that their retrievals read (the session check is the
// first claim statement), then the ends, then claims of the machines those
// ends freed. The check before COMMIT follows (Run's guard, the lease),
// unless the attempt's last statement checked the session. With sweep,
// the first claim statement sweeps the process's expired claims.
func (q *queue) attempt(ctx context.Context, tx *txn.Tx, tok *pickToken, claims, ends []*request, sweep bool) error {
	for _, r := range append(claims, ends...) {
		r.suspect, r.claimFailed, r.panicked = false, false, nil
	}
	var cp *claimPass
	if len(claims) > 0 {
		cp = q.newClaimPass(claims, tok, sweep)
		if err := cp.run(ctx, tx); err != nil {
			return err
		}
	}
	if !tx.EverChecked() {
		if err := q.e.lease.Check(ctx, tx); err != nil {
			return err
		}
	}
	if len(ends) == 0 {
		return nil
	}
	freed, err := q.endInTx(ctx, tx, ends)
	if err != nil {
		return err
	}
	if cp != nil {
		return cp.claimFreed(ctx, tx, freed)
	}
	return nil
}

// giveUpClaim makes r, a call that also ends, run as an end alone: its
// claim part gets err as its outcome. A failure of the claim (its
// retrieve failed, retries ran out) never undoes the call's own end.
func giveUpClaim(r *request, err error) {
	r.claim.Claims, r.claim.Abandoned, r.claim.Err = nil, nil, err
	r.claimDone = true
}

// batchBound is the context of a batch's transaction: bounded by the
// latest deadline of its calls' contexts (none if one has none), but not
// by their cancellation, since once it has begun a batch runs for all its
// calls. The session bounds it too (lease.Bound). Owned by the goroutine
// running the batch.
type batchBound struct {
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

// settle is the failure policy: it replies to every call of a batch whose
// transaction returned err.
//   - Committed (nil), or an error that fails every call alike (the
//     session's, the batch's context, ambiguous): each gets it.
//   - Callbacks failed or panicked: their calls are the suspects. One
//     suspect gets the error; several (a Shared commit's) run again one by
//     one. The other calls run again as a batch. A call that also ends
//     and whose retrieve failed gives up its claim and runs again as an
//     end: its own end is not undone by its claim.
//   - A statement failed for a reason any call may have caused (a
//     constraint an application added, say): each runs again alone.
//   - Claims and ends ran out of retries together: the claims fail, the
//     ends run again as a batch of their own (ends free machines).
func (q *queue) settle(ctx context.Context, reqs []*request, err error) {
	if len(reqs) == 1 && err != nil && isolatable(ctx, err) {
		if r := reqs[0]; r.suspect && r.claimFailed && r.end != nil {
			giveUpClaim(r, err)
			q.runBatch(reqs, false)
			return
		}
	}
	switch {
	case err == nil || len(reqs) == 1:
	case errors.Is(err, txn.ErrRetriesExhausted):
		claims, ends := split(reqs)
		if len(claims) > 0 && len(ends) > 0 {
			var claimsOnly []*request
			for _, r := range claims {
				if r.end != nil {
					giveUpClaim(r, err)
				} else {
					claimsOnly = append(claimsOnly, r)
				}
			}
			q.reply(claimsOnly, err)
			q.runBatch(ends, false)
			return
		}
	case isolatable(ctx, err):
		var suspects, others []*request
		for _, r := range reqs {
			switch {
			case r.suspect && r.claimFailed && r.end != nil:
				giveUpClaim(r, err) // its end runs again, with the others
				others = append(others, r)
			case r.suspect:
				suspects = append(suspects, r)
			default:
				others = append(others, r)
			}
		}
		if len(suspects) == 0 {
			suspects, others = reqs, nil
		}
		if len(suspects) == 1 && len(others) > 0 {
			q.reply(suspects, err)
		} else {
			for _, r := range suspects {
				q.runBatch([]*request{r}, false)
			}
		}
		if len(others) > 0 {
			q.runBatch(others, false)
		}
		return
	}
	q.reply(reqs, err)
}

// isolatable reports whether err, a batch's error, may have been caused by
// one of its calls rather than by what they share: the session, the
// batch's context, the retry budget, the connection, the COMMIT. A context
// error while the batch's context is fine comes from a callback that used
// its own caller's context.
func isolatable(ctx context.Context, err error) bool {
	switch {
	case ctx.Err() != nil, errors.Is(err, lease.ErrSessionExpired), errors.Is(err, lease.ErrSessionClosed),
		errors.Is(err, txn.ErrConnectionClosed), errors.Is(err, txn.ErrRetriesExhausted),
		errors.Is(err, txn.ErrAmbiguousCommit):
		return false
	}
	return true
}

// reply gives each of reqs err as the batch's outcome, counts what
// committed, and wakes its caller.
func (q *queue) reply(reqs []*request, err error) {
	for _, r := range reqs {
		r.err = err
		if r.claim != nil {
			r.claim.Batch = r.batch
		}
		if r.end != nil {
			r.end.Batch = r.batch
		}
		q.record(r)
		close(r.done)
	}
}

// record counts what r's call did, once its batch has replied: the claim
// call's outcome, its claims' Started events and latency, the Abandoned
// events of its takeovers, and a committed end's event and backoff.
func (q *queue) record(r *request) {
	st := q.e.counters
	if c := r.claim; c != nil {
		err := c.Err
		if r.err != nil {
			err = r.err
		}
		p := st.Process(q.process)
		p.Asked.Add(int64(c.Limit))
		counted := true
		switch {
		case errors.Is(err, ErrWorkConflict):
			p.Conflicts.Add(1)
		case errors.Is(err, ErrProcessPaused):
			p.Paused.Add(1)
		case errors.Is(err, ErrCapReached):
			p.Capped.Add(1)
		case errors.Is(err, ErrNothingToDo):
			p.Nothing.Add(1)
		case err != nil:
			counted = false
		}
		if counted {
			p.Calls.Add(1)
			p.Claimed.Add(int64(len(c.Claims)))
		}
		if err == nil {
			st.Events(c.Abandoned, store.WorkHistoryEventAbandoned)
			p.TakenOver.Add(int64(len(c.Abandoned)))
			for range c.Claims {
				st.Event(q.process, store.WorkHistoryEventStarted)
				if observe := q.e.cfg.ObserveClaim; observe != nil {
					observe(q.process, time.Since(c.start))
				}
			}
		}
	}
	if e := r.end; e != nil && r.err == nil && e.Err == nil {
		st.Event(q.process, e.Event)
		if e.Event == store.WorkHistoryEventFailed && e.Backoff != nil {
			st.Process(q.process).Backoffs.Add(1)
		}
	}
}

// callback runs fn, a callback of the application's for reqs (a retrieve,
// a commit, a Shared commit), and marks reqs as suspects if it fails or
// panics. A panic is recovered here, on the batch's goroutine, and becomes
// an error that rolls the attempt back; Do panics again on the caller's.
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

// split returns the calls of reqs that claim and those that end (a call
// that does both is in both, unless it gave up its claim).
func split(reqs []*request) (claims, ends []*request) {
	for _, r := range reqs {
		if r.claim != nil && !r.claimDone {
			claims = append(claims, r)
		}
		if r.end != nil {
			ends = append(ends, r)
		}
	}
	return claims, ends
}
