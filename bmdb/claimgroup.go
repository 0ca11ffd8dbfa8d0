package bmdb

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
)

// claimRequest is one Work or WorkBatch call in a claim group.
type claimRequest struct {
	limit    int
	retrieve func(tx *Tx) ([]uuid.UUID, error)

	// Results, set by the group.
	claims    []claim
	abandoned []string // processes of claims ended as Abandoned by a takeover
	err       error
}

// claimGrouped claims for r in a group of the session's concurrent calls
// for process, and returns r's own outcome.
func (s *Session) claimGrouped(ctx context.Context, process string, r *claimRequest) error {
	if err := s.inGroup(ctx, process, &groupOp{claim: r}); err != nil {
		return err
	}
	return r.err
}

// resolveGroup finds out, after an ambiguous COMMIT, which of the group's
// claims committed, and gives each member its own (or the ambiguous error
// if none of its claims did).
func (s *Session) resolveGroup(ctx context.Context, process string, reqs []*claimRequest, ambiguous error) error {
	var all []claim
	for _, r := range reqs {
		all = append(all, r.claims...)
	}
	if len(all) == 0 {
		return ambiguous
	}
	held, err := s.resolveAmbiguousClaims(ctx, process, all, ambiguous)
	if err != nil {
		return err
	}
	kept := map[uuid.UUID]bool{}
	for _, c := range held {
		kept[c.id] = true
	}
	for _, r := range reqs {
		var mine []claim
		for _, c := range r.claims {
			if kept[c.id] {
				mine = append(mine, c)
			}
		}
		r.claims, r.err = mine, nil
		if len(mine) == 0 {
			r.err = ambiguous
		}
	}
	return nil
}

// claimInTx is the body of a group's claim transaction: it runs every
// member's retrieve, claims for each, in rounds of one multi-row statement,
// the first of its candidates that no other member took and that are free,
// up to its limit, and takes a claim of an expired session over for each
// member left with none. A member's ErrNothingToDo or ErrWorkConflict is
// its own result; any other error fails the transaction.
func (s *Session) claimInTx(ctx context.Context, tx *Tx, process string, reqs []*claimRequest) error {
	candidates := make([][]uuid.UUID, len(reqs))
	for i, r := range reqs {
		r.claims, r.abandoned, r.err = nil, nil, nil
		ids, err := r.retrieve(tx)
		if err != nil {
			return fmt.Errorf("bmdb: Work(%q): retrieve: %w", process, err)
		}
		candidates[i] = distinct(ids)
	}
	used := map[uuid.UUID]bool{}
	next := make([]int, len(reqs)) // the next candidate of each member to try
	for {
		var picks []uuid.UUID
		owner := map[uuid.UUID]int{}
		for i, r := range reqs {
			for need := r.limit - len(r.claims); need > 0 && next[i] < len(candidates[i]); next[i]++ {
				m := candidates[i][next[i]]
				if used[m] {
					continue
				}
				used[m], owner[m] = true, i
				picks = append(picks, m)
				need--
			}
		}
		if len(picks) == 0 {
			break
		}
		got, err := s.claimMany(ctx, tx, process, picks)
		if err != nil {
			return err
		}
		for _, c := range got {
			r := reqs[owner[c.machine]]
			r.claims = append(r.claims, c)
		}
	}
	claimed := map[uuid.UUID]bool{} // machines claimed in this transaction
	for _, r := range reqs {
		for _, c := range r.claims {
			claimed[c.machine] = true
		}
	}
	for i, r := range reqs {
		if len(r.claims) > 0 {
			continue
		}
		rest := make([]uuid.UUID, 0, len(candidates[i]))
		for _, m := range candidates[i] {
			if !claimed[m] {
				rest = append(rest, m)
			}
		}
		c, abandoned, err := s.takeOverFirst(ctx, tx, process, rest)
		switch {
		case errors.Is(err, ErrNothingToDo) || errors.Is(err, ErrWorkConflict):
			r.err = err
		case err != nil:
			return err
		default:
			r.claims, r.abandoned = []claim{c}, abandoned
			claimed[c.machine] = true
		}
	}
	return nil
}
