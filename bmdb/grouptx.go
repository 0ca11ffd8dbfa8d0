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
// (an end's Work stays open). If a group of claims and ends ran out of
// retries, the ends, which may have joined at its last attempts, get a
// transaction of their own.
func (s *Session) runGroup(process string, g *group[*groupOp]) {
	err := s.groupFor(g.ctx, process, func() int { return priorityOf(requests(g.members)) },
		func() []*groupOp { return requests(g.grow()) })
	ops := requests(g.members)
	switch {
	case len(ops) > 1 && g.isolate(err):
		for _, op := range ops {
			s.runAlone(g.ctx, process, []*groupOp{op})
		}
	case errors.Is(err, ErrRetriesExhausted) && hasClaimsAndEnds(ops):
		var ends []*groupOp
		for _, op := range ops {
			if op.end != nil {
				ends = append(ends, op)
			} else {
				op.fail(err)
			}
		}
		s.runAlone(g.ctx, process, ends)
	case err != nil:
		for _, op := range ops {
			op.fail(err)
		}
	}
}

// runAlone runs ops in a transaction of their own, without queued calls.
func (s *Session) runAlone(ctx context.Context, process string, ops []*groupOp) {
	err := s.groupFor(ctx, process, func() int { return priorityOf(ops) }, func() []*groupOp { return ops })
	if err != nil {
		for _, op := range ops {
			op.fail(err)
		}
	}
}

// hasClaimsAndEnds reports whether ops holds both claims and ends.
func hasClaimsAndEnds(ops []*groupOp) bool {
	claims, ends := split(ops)
	return len(claims) > 0 && len(ends) > 0
}

// fail gives op err as its result.
func (op *groupOp) fail(err error) {
	if op.claim != nil {
		op.claim.claims, op.claim.abandoned, op.claim.err = nil, nil, err
		return
	}
	op.end.err = err
}

// groupFor runs one group transaction for the ops that members returns at
// the start of each attempt, all of process, each attempt admitted at
// priority(), and sets their results. It returns the transaction's error,
// after which the results are not to be used, except after an ambiguous
// COMMIT: the claims that committed are found and handed to their members,
// and if any did, the transaction committed, ends included.
func (s *Session) groupFor(ctx context.Context, process string, priority func() int, members func() []*groupOp) error {
	var claims []*claimRequest
	var ends []*endRequest
	err := s.claimTransactAt(ctx, priority, func(tx *Tx) error {
		claims, ends = split(members())
		if len(ends) > 0 {
			if err := s.endInTx(ctx, tx, process, ends); err != nil {
				return err
			}
		}
		if len(claims) > 0 {
			return s.claimInTx(ctx, tx, process, claims)
		}
		return nil
	})
	if errors.Is(err, ErrAmbiguousCommit) && len(claims) > 0 {
		if err := s.resolveGroup(ctx, process, claims, err); err != nil {
			return err
		}
		err = nil // some of its claims are held: it committed
	}
	if err == nil {
		for _, r := range ends {
			s.recordEnd(r)
		}
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
