package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/wait"
)

// claimRequest is a Work or WorkBatch call: what to claim, and what was.
type claimRequest struct {
	limit    int
	retrieve func(tx *Tx) ([]uuid.UUID, error)

	// The outcome, set by each attempt of its batch's transaction.
	claims    []claim
	abandoned []string // processes of the claims a takeover ended as Abandoned
	err       error    // ErrNothingToDo or ErrWorkConflict
}

// claim is one claim taken by a claim transaction.
type claim struct {
	machine uuid.UUID
	id      uuid.UUID // work.claim_id: what Finish, Cancel and Fail fence on
	token   int64     // its fencing token
}

// claimInTx is the claims' part of a batch's transaction, all for process.
// It runs every request's retrieve; then, in rounds of one multi-row
// statement, claims for each the first of its candidates that no other
// request took and that are free, up to its limit; then takes a claim of
// an expired session over for each request left with none. A request's
// ErrNothingToDo, ErrWorkConflict or ErrUnknownMachine is its own outcome;
// any other error fails the transaction.
func (s *Session) claimInTx(ctx context.Context, tx *Tx, process string, reqs []*request) error {
	candidates := make([][]uuid.UUID, len(reqs))
	for i, r := range reqs {
		c := r.claim
		c.claims, c.abandoned, c.err = nil, nil, nil
		var ids []uuid.UUID
		err := callback(reqs[i:i+1], func() (err error) {
			ids, err = c.retrieve(tx)
			return err
		})
		if err != nil {
			return fmt.Errorf("bmdb: Work(%q): retrieve: %w", process, err)
		}
		candidates[i] = distinct(ids)
	}
	used := map[uuid.UUID]bool{}
	next := make([]int, len(reqs)) // the next candidate of each request to try
	for {
		var picks []uuid.UUID
		owner := map[uuid.UUID]*claimRequest{}
		for i, r := range reqs {
			for need := r.claim.limit - len(r.claim.claims); need > 0 && next[i] < len(candidates[i]); next[i]++ {
				m := candidates[i][next[i]]
				if used[m] {
					continue
				}
				used[m], owner[m] = true, r.claim
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
			owner[c.machine].claims = append(owner[c.machine].claims, c)
		}
	}
	claimed := map[uuid.UUID]bool{} // machines claimed in this transaction
	for _, r := range reqs {
		for _, c := range r.claim.claims {
			claimed[c.machine] = true
		}
	}
	for i, r := range reqs {
		c := r.claim
		if len(c.claims) > 0 {
			continue
		}
		rest := make([]uuid.UUID, 0, len(candidates[i]))
		for _, m := range candidates[i] {
			if !claimed[m] {
				rest = append(rest, m)
			}
		}
		got, abandoned, err := s.takeOverFirst(ctx, tx, process, rest)
		if errors.Is(err, ErrNothingToDo) && len(rest) < len(candidates[i]) {
			// Candidates went to other calls of this batch: claimed.
			err = fmt.Errorf("%w (process %q)", ErrWorkConflict, process)
		}
		switch {
		case errors.Is(err, ErrNothingToDo) || errors.Is(err, ErrWorkConflict) || errors.Is(err, ErrUnknownMachine):
			c.err = err
		case err != nil:
			return err
		default:
			c.claims, c.abandoned = []claim{got}, abandoned
			claimed[got.machine] = true
		}
	}
	return nil
}

// claimMany claims, with one WorkClaimMany, each of machines that is
// neither claimed for process nor in backoff for it, and returns the claims
// made, in the order of machines.
func (s *Session) claimMany(ctx context.Context, tx *Tx, process string, machines []uuid.UUID) ([]claim, error) {
	rows, err := tx.q.WorkClaimMany(ctx, store.WorkClaimManyParams{
		MachineIds: machines, Process: process, SessionID: s.id, ComponentName: s.conn.cfg.ComponentName,
	})
	if err != nil {
		return nil, fmt.Errorf("bmdb: Work(%q): claiming %d machines: %w", process, len(machines), err)
	}
	byMachine := make(map[uuid.UUID]claim, len(rows))
	for _, r := range rows {
		byMachine[r.MachineID] = claim{machine: r.MachineID, id: r.ClaimID.UUID, token: r.FencingToken.Int64}
	}
	var claimed []claim
	for _, m := range machines {
		if c, ok := byMachine[m]; ok {
			claimed = append(claimed, c)
		}
	}
	return claimed, nil
}

// takeOverFirst takes over the first candidate whose claim is held by an
// expired session, or says why no candidate can be claimed: ErrWorkConflict
// if one is claimed by a live session or being claimed by another
// transaction (machines another process is working on), ErrNothingToDo if
// all are in backoff, ErrUnknownMachine if one is not a machine. It reads
// the candidates' states in one statement,
// and returns the processes of the claims it ended as Abandoned.
func (s *Session) takeOverFirst(ctx context.Context, tx *Tx, process string, candidates []uuid.UUID) (claim, []string, error) {
	if len(candidates) == 0 {
		return claim{}, nil, fmt.Errorf("%w (process %q)", ErrNothingToDo, process)
	}
	states, err := tx.q.WorkClaimStates(ctx, store.WorkClaimStatesParams{MachineIds: candidates, Process: process})
	if err != nil {
		return claim{}, nil, fmt.Errorf("bmdb: Work(%q): reading the claims of %d candidates: %w", process, len(candidates), err)
	}
	for i, state := range states {
		if !state.Known {
			return claim{}, nil, fmt.Errorf("%w: retrieve returned %s for %q, which is not in the machines table", ErrUnknownMachine, candidates[i], process)
		}
	}
	conflict := false
	for i, state := range states {
		machine := candidates[i]
		switch {
		case state.InBackoff:
			continue
		case !state.Holder.Valid || state.HolderLive || state.Holder.UUID == s.id:
			conflict = true
			continue
		}
		abandoned, err := s.takeOver(ctx, tx, process, machine, state.Holder.UUID)
		if err != nil {
			return claim{}, nil, err
		}
		if abandoned == nil { // the holder came back to life, or went: try the next
			conflict = true
			continue
		}
		got, err := s.claimMany(ctx, tx, process, []uuid.UUID{machine})
		if err != nil {
			return claim{}, nil, err
		}
		if len(got) == 0 { // being claimed by another transaction
			conflict = true
			continue
		}
		return got[0], abandoned, nil
	}
	if conflict {
		return claim{}, nil, fmt.Errorf("%w (process %q)", ErrWorkConflict, process)
	}
	return claim{}, nil, fmt.Errorf("%w (process %q)", ErrNothingToDo, process)
}

// takeOver supersedes the expired session holding (machine, process): it
// locks the session row, ends all its claims as Abandoned and deletes it
// (see Mechanism in the package doc for how this orders the holder's open
// transactions). It returns the processes of the claims ended, or nil if
// holder is alive or gone by now.
func (s *Session) takeOver(ctx context.Context, tx *Tx, process string, machine, holder uuid.UUID) ([]string, error) {
	_, err := tx.q.SessionLockIfExpired(ctx, holder)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bmdb: Work(%q): taking %s over from session %s: %w", process, machine, holder, err)
	}
	abandoned, _, err := supersede(ctx, tx, []uuid.UUID{holder})
	if err != nil {
		return nil, fmt.Errorf("bmdb: Work(%q): taking %s over from session %s: %w", process, machine, holder, err)
	}
	if abandoned == nil {
		abandoned = []string{}
	}
	return abandoned, nil
}

// resolveClaims finds out, after the COMMIT of a batch with claims was
// ambiguous, which of its claims committed (their claim ids are in the
// work table), so that no claim is left held by a live session with
// nobody working on it, and gives each request its own, or the ambiguous
// error if none of its claims did. It keeps trying while ctx and the
// session allow, and returns ambiguous (or why it could not find out) if
// none committed: then nothing of the batch did.
func (s *Session) resolveClaims(ctx context.Context, process string, reqs []*request, ambiguous error) error {
	var all []claim
	for _, r := range reqs {
		all = append(all, r.claim.claims...)
	}
	if len(all) == 0 {
		return ambiguous
	}
	held := map[uuid.UUID]bool{}
	for delay := txRetryBase; ; delay = min(2*delay, txRetryCap) {
		err := s.transact(ctx, func(tx *Tx) error {
			clear(held)
			for _, c := range all {
				w, err := tx.q.WorkGet(ctx, store.WorkGetParams{MachineID: c.machine, Process: process})
				switch {
				case errors.Is(err, sql.ErrNoRows):
				case err != nil:
					return err
				case w.ClaimID == c.id:
					held[c.id] = true
				}
			}
			return nil
		}, claimSlot(priorityEnd))
		if err == nil {
			break
		}
		if ctx.Err() != nil || s.ctx.Err() != nil || wait.Sleep(ctx, delay) != nil {
			// Close, or the session's expiry, removes whatever committed.
			return fmt.Errorf("%w; then, finding out what it claimed: %w", ambiguous, err)
		}
	}
	if len(held) == 0 {
		return ambiguous
	}
	for _, r := range reqs {
		c := r.claim
		var mine []claim
		for _, got := range c.claims {
			if held[got.id] {
				mine = append(mine, got)
			}
		}
		c.claims, c.err = mine, nil
		if len(mine) == 0 {
			c.err = ambiguous
		}
	}
	return nil
}

// recordClaims counts a claim call of process that asked for limit
// machines and got claimed, with err, in Stats and in the metrics: the
// machines asked for, and conflicts and nothing-to-do apart.
func (c *Connection) recordClaims(process string, limit, claimed int, err error) {
	st, m := &c.stats, c.metrics
	m.asked(process, limit)
	switch {
	case errors.Is(err, ErrWorkConflict):
		st.claimConflicts.Add(1)
		m.conflict(process)
	case errors.Is(err, ErrNothingToDo):
		st.claimNothingToDo.Add(1)
		m.nothingToDo(process)
	case err != nil:
		return
	}
	st.claimCalls.Add(1)
	st.claimsAsked.Add(int64(limit))
	st.claimed.Add(int64(claimed))
}

// distinct returns ids without repetitions, in first-seen order.
func distinct(ids []uuid.UUID) []uuid.UUID {
	if len(ids) < 2 {
		return ids
	}
	seen := make(map[uuid.UUID]bool, len(ids))
	out := ids[:0:0]
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}
