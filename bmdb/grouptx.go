package bmdb

import (
	"context"
	"errors"
	"sync"
)

// A session's claims (Work, WorkBatch) and ends (Finish, FinishWith,
// Cancel, Fail) of one process wait in one queue, and one transaction
// serves whatever of both is waiting: the ends first, then the claims. So a
// worker that finishes a machine and claims the next one at about the same
// time (worker.Loop does) pays for one transaction, not two.

// groupOp is one call in a group: a claim or an end.
type groupOp struct {
	claim *claimRequest // nil for an end
	end   *endRequest   // nil for a claim
}

// groupQueues holds a session's group queue per process.
type groupQueues struct {
	mu     sync.Mutex
	limit  int
	byProc map[string]*queue[*groupOp]
}

// of returns the queue of process.
func (q *groupQueues) of(process string) *queue[*groupOp] {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.byProc == nil {
		q.byProc = map[string]*queue[*groupOp]{}
	}
	if q.byProc[process] == nil {
		q.byProc[process] = &queue[*groupOp]{limit: q.limit}
	}
	return q.byProc[process]
}

// inGroup runs op, a call for process, in a group of the session's
// concurrent calls for process, and returns the group's error for op (op's
// own result is in its request).
func (s *Session) inGroup(ctx context.Context, process string, op *groupOp) error {
	return s.groups.of(process).do(ctx, op, func(g *group[*groupOp]) { s.runGroup(process, g) })
}

// runGroup runs one transaction for g and gives each member its result. If
// the transaction fails with an error that one member may have caused (a
// retrieve, a commit callback, a machine that does not exist), each member
// runs in a transaction of its own instead, so that only that member fails
// (an end's Work stays open).
func (s *Session) runGroup(process string, g *group[*groupOp]) {
	err := s.groupFor(g.ctx, process, priorityOf(requests(g.members)), func() []*groupOp { return requests(g.grow()) })
	ops := requests(g.members)
	if len(ops) > 1 && g.isolate(err) {
		for _, op := range ops {
			if err := s.groupFor(g.ctx, process, priorityOf([]*groupOp{op}), func() []*groupOp { return []*groupOp{op} }); err != nil {
				op.fail(err)
			}
		}
		return
	}
	if err != nil {
		for _, op := range ops {
			op.fail(err)
		}
	}
}

// fail gives op err as its result.
func (op *groupOp) fail(err error) {
	if op.claim != nil {
		op.claim.claims, op.claim.abandoned, op.claim.err = nil, nil, err
		return
	}
	op.end.err = err
}

// groupFor runs one group transaction, admitted at priority, for the ops
// that members returns at the start of each attempt, all of process, and
// sets their results. It
// returns the transaction's error, after which the results are not to be
// used, except that after an ambiguous COMMIT the claims that did commit
// are found and handed to their members.
func (s *Session) groupFor(ctx context.Context, process string, priority int, members func() []*groupOp) error {
	var claims []*claimRequest
	var ends []*endRequest
	err := s.claimTransact(ctx, priority, func(tx *Tx) error {
		claims, ends = split(members())
		if len(ends) > 0 {
			if err := s.endInTx(ctx, tx, ends); err != nil {
				return err
			}
		}
		if len(claims) > 0 {
			return s.claimInTx(ctx, tx, process, claims)
		}
		return nil
	})
	switch {
	case err == nil:
		for _, r := range ends {
			s.recordEnd(r)
		}
	case errors.Is(err, ErrAmbiguousCommit) && len(claims) > 0:
		for _, r := range ends {
			r.err = err
		}
		return s.resolveGroup(ctx, process, claims, err)
	}
	return err
}

// priorityOf is the claim-slot priority of a group: that of ends if it
// holds one (it frees machines), else that of claims.
func priorityOf(ops []*groupOp) int {
	for _, op := range ops {
		if op.end != nil {
			return priorityEnd
		}
	}
	return priorityClaim
}

// requests returns the requests of members.
func requests[R any](members []*member[R]) []R {
	reqs := make([]R, len(members))
	for i, m := range members {
		reqs[i] = m.req
	}
	return reqs
}

// split returns the claims and the ends of ops.
func split(ops []*groupOp) (claims []*claimRequest, ends []*endRequest) {
	for _, op := range ops {
		if op.claim != nil {
			claims = append(claims, op.claim)
		} else {
			ends = append(ends, op.end)
		}
	}
	return claims, ends
}
