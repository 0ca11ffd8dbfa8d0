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

// claimRequest is a Work or WorkMany call: what to claim, and what was.
type claimRequest struct {
	limit    int
	retrieve func(tx *Tx) ([]uuid.UUID, error)

	// The outcome, set by each attempt of its batch's transaction.
	claims    []claim
	abandoned []string // processes of the claims a takeover ended as Abandoned
	err       error    // ErrNothingToDo (or ErrProcessPaused, ErrCapReached), ErrWorkConflict or ErrUnknownMachine

	fenced bool // made claim rows for its candidates and ran again (errRerun); owned by its batch
}

// claim is one claim taken by a claim transaction.
type claim struct {
	machine uuid.UUID
	id      uuid.UUID // work.claim_id: what Finish, Cancel and Fail fence on
	token   int64     // its fencing token
}

// claimPass is the claims' part of one attempt of a batch's transaction,
// all for one process: the requests, their candidates, and how far each
// got. Owned by the batch's goroutine.
type claimPass struct {
	b          *batcher
	reqs       []*request
	candidates [][]uuid.UUID      // each request's, distinct, in its order
	used       map[uuid.UUID]bool // candidates tried
	checks     *checks            // the attempt's session checks
	blocked    error              // ErrProcessPaused or ErrCapReached, if the last claim statement found so
}

func (b *batcher) newClaimPass(reqs []*request, c *checks) *claimPass {
	return &claimPass{b: b, reqs: reqs, candidates: make([][]uuid.UUID, len(reqs)), used: map[uuid.UUID]bool{}, checks: c}
}

// run runs every request's retrieve, and hands their candidates to the
// fencer; then, in rounds of one statement, claims for each the first of
// its candidates that no other request took and that are free, up to its
// limit (the first statement is also the session check, so that the
// retrievals' snapshot is as fresh as can be when the candidates are
// locked); then, unless the process is paused or at its cap (which gives
// each request left with none ErrProcessPaused or ErrCapReached), takes a
// claim of an expired session over for each request left with none. A
// request's ErrNothingToDo, ErrWorkConflict or ErrUnknownMachine is its
// own outcome; any other error fails the attempt. A request left with nothing but candidates without a claim row
// has their rows made, once, and the attempt runs again (errRerun): its
// snapshot cannot see them.
func (p *claimPass) run(ctx context.Context, tx *Tx) error {
	b := p.b
	for i, r := range p.reqs {
		c := r.claim
		c.claims, c.abandoned, c.err = nil, nil, nil
		var ids []uuid.UUID
		err := callback(p.reqs[i:i+1], func() (err error) {
			ids, err = c.retrieve(tx)
			return err
		})
		if err != nil {
			return fmt.Errorf("bmdb: Work(%q): retrieve: %w", b.process, err)
		}
		p.candidates[i] = distinct(ids)
		b.fences.ahead(p.candidates[i])
	}
	if err := p.rounds(ctx, tx, func(uuid.UUID) bool { return true }); err != nil {
		return err
	}
	if !p.checks.first {
		if err := b.s.check(ctx, tx); err != nil {
			return err
		}
		p.checks.first = true
	}
	if p.blocked != nil {
		// Paused, or no slot free under the cap: a takeover could not
		// claim either (GC ends expired sessions' claims).
		for _, r := range p.reqs {
			if len(r.claim.claims) == 0 {
				r.claim.err = fmt.Errorf("%w (process %q)", p.blocked, b.process)
			}
		}
		return nil
	}
	return p.takeOvers(ctx, tx)
}

// rounds claims, in rounds of one statement, for each request the first
// of its untried candidates (among those may allows) that are free, up to
// its limit. A request alone offers the statement all its candidates, of
// which it claims the first free ones up to the limit, in one round; of
// several, each offers as many as it needs, and the next round the next
// ones, so that each gets its own.
func (p *claimPass) rounds(ctx context.Context, tx *Tx, may func(uuid.UUID) bool) error {
	next := make([]int, len(p.reqs))
	for {
		var picks []uuid.UUID
		owner := map[uuid.UUID]*claimRequest{}
		want := 0
		for i, r := range p.reqs {
			need := r.claim.limit - len(r.claim.claims)
			want += max(need, 0)
			offer := need
			if len(p.reqs) == 1 {
				offer = len(p.candidates[i])
			}
			for ; offer > 0 && need > 0 && next[i] < len(p.candidates[i]); next[i]++ {
				m := p.candidates[i][next[i]]
				if p.used[m] || !may(m) {
					continue
				}
				p.used[m], owner[m] = true, r.claim
				picks = append(picks, m)
				offer--
			}
		}
		if len(picks) == 0 {
			return nil
		}
		got, ctl, err := p.b.s.claimMany(ctx, tx, p.b.process, picks, min(want, len(picks)), p.checks)
		if err != nil {
			return err
		}
		if p.blocked = ctl.blocked(); p.blocked != nil && len(got) == 0 {
			return nil
		}
		for _, c := range got {
			owner[c.machine].claims = append(owner[c.machine].claims, c)
		}
	}
}

// claimedMachines returns the machines claimed so far in this transaction.
func (p *claimPass) claimedMachines() map[uuid.UUID]bool {
	claimed := map[uuid.UUID]bool{}
	for _, r := range p.reqs {
		for _, c := range r.claim.claims {
			claimed[c.machine] = true
		}
	}
	return claimed
}

// takeOvers takes, for each request left with no claim, a claim of an
// expired session over, or gives it its outcome.
func (p *claimPass) takeOvers(ctx context.Context, tx *Tx) error {
	s, process := p.b.s, p.b.process
	claimed := p.claimedMachines()
	for i, r := range p.reqs {
		c := r.claim
		if len(c.claims) > 0 {
			continue
		}
		rest := make([]uuid.UUID, 0, len(p.candidates[i]))
		for _, m := range p.candidates[i] {
			if !claimed[m] {
				rest = append(rest, m)
			}
		}
		got, abandoned, unfenced, err := s.takeOverFirst(ctx, tx, process, rest, p.checks)
		switch {
		case err == nil:
			c.claims, c.abandoned = []claim{got}, abandoned
			claimed[got.machine] = true
			continue
		case errors.Is(err, ErrUnknownMachine):
		case !errors.Is(err, ErrNothingToDo) && !errors.Is(err, ErrWorkConflict):
			return err
		case len(unfenced) > 0 && !c.fenced:
			if err := p.b.fences.ensure(ctx, unfenced); err != nil {
				return fmt.Errorf("bmdb: Work(%q): %w", process, err)
			}
			c.fenced = true
			return errRerun
		case len(unfenced) > 0 || len(rest) < len(p.candidates[i]):
			// Being made by another session, or taken by other calls
			// of this batch: claimed.
			err = fmt.Errorf("%w (process %q)", ErrWorkConflict, process)
		}
		c.err = err
	}
	return nil
}

// claimFreed claims, for the requests that want more, those of their
// candidates that the batch's ends freed: tried before the ends ran, they
// were this session's own claims then. If the claims found the process at
// its cap, the ends freed slots too: every candidate not claimed is tried
// again.
func (p *claimPass) claimFreed(ctx context.Context, tx *Tx, freed []uuid.UUID) error {
	if len(freed) == 0 {
		return nil
	}
	set := make(map[uuid.UUID]bool, len(freed))
	capped := errors.Is(p.blocked, ErrCapReached)
	if capped {
		p.blocked = nil
		claimed := p.claimedMachines()
		for m := range p.used {
			if !claimed[m] {
				p.used[m], set[m] = false, true
			}
		}
	}
	for _, m := range freed {
		if p.used[m] {
			p.used[m], set[m] = false, true
		}
	}
	if len(set) == 0 {
		return nil
	}
	if err := p.rounds(ctx, tx, func(m uuid.UUID) bool { return set[m] }); err != nil {
		return err
	}
	for _, r := range p.reqs {
		if len(r.claim.claims) > 0 {
			r.claim.err = nil
		}
	}
	return nil
}

// claimMany claims, with one WorkClaimMany, up to limit of machines (the
// first, in their order) that are neither claimed for process nor in
// backoff for it nor being claimed or ended by another transaction, as the
// process's controls allow, and returns the claims made, in the order of
// machines, and the controls as the statement found them. The statement
// checks the session too (checked, c): it fails with the session's error
// if it has ended. A process without a controls row has it made, and the
// attempt runs again (errRerun).
//
// Under snapshot isolation (PostgreSQL's REPEATABLE READ) the statement
// fails with 40001 if one of machines was claimed or ended by a
// transaction that committed after this one's snapshot (first committer
// wins: WorkClaimMany), or the process's controls were changed: a
// retrieval that read before that commit returned it. claimMany returns
// that as errStale: the attempt runs again, at once, with a snapshot that
// sees the commit, and its retrievals do too.
func (s *Session) claimMany(ctx context.Context, tx *Tx, process string, machines []uuid.UUID, limit int, c *checks) ([]claim, controls, error) {
	c.last = false
	rows, err := tx.q.WorkClaimMany(ctx, store.WorkClaimManyParams{
		MachineIds: machines, Process: process, SessionID: s.id, ComponentName: s.conn.cfg.ComponentName,
		MaxClaims: int64(limit), MaxIdleMs: s.maxIdleMs(),
	})
	switch {
	case err == nil:
	case s.conn.batchTx == snapshot && sqlState(err) == codeSerializationFailure:
		s.conn.stats.process(process).stale.Add(1)
		return nil, controls{}, fmt.Errorf("%w: %w", errStale, err)
	default:
		return nil, controls{}, fmt.Errorf("bmdb: Work(%q): claiming %d machines: %w", process, len(machines), err)
	}
	if err := s.checked(c, len(rows) > 0 && rows[0].Alive); err != nil { // the statement is a session check too
		return nil, controls{}, err
	}
	head := rows[0]
	ctl := controls{paused: head.Paused, cap: head.ClaimCap.Int64, freeSlots: head.FreeSlots}
	if !head.Controlled {
		if err := s.ensureControls(ctx, process); err != nil {
			return nil, ctl, fmt.Errorf("bmdb: Work(%q): %w", process, err)
		}
		return nil, ctl, errRerun
	}
	s.conn.stats.process(process).sawControls(ctl)
	byMachine := make(map[uuid.UUID]claim, len(rows))
	for _, r := range rows {
		if r.MachineID.Valid {
			byMachine[r.MachineID.UUID] = claim{machine: r.MachineID.UUID, id: r.ClaimID.UUID, token: r.FencingToken.Int64}
		}
	}
	var claimed []claim
	for _, m := range machines {
		if c, ok := byMachine[m]; ok {
			claimed = append(claimed, c)
		}
	}
	return claimed, ctl, nil
}

// controls are a process's fleet controls as a claim statement found them.
type controls struct {
	paused    bool
	cap       int64 // 0: none
	freeSlots int64 // slots below the cap the statement locked
}

// blocked returns why the controls let the statement claim nothing:
// ErrProcessPaused, ErrCapReached (a cap, and no free slot), or nil.
func (c controls) blocked() error {
	switch {
	case c.paused:
		return ErrProcessPaused
	case c.cap > 0 && c.freeSlots == 0:
		return ErrCapReached
	}
	return nil
}

// errStale ends a batch attempt whose claim statement met a candidate
// that another transaction claimed or ended after its snapshot.
var errStale = fmt.Errorf("%w: a candidate was claimed or ended after the snapshot", errRerun)

// takeOverFirst takes over the first candidate whose claim is held by an
// expired session, or says why no candidate can be claimed: ErrWorkConflict
// if one is claimed by a live session or being claimed by another
// transaction (machines another process is working on), ErrNothingToDo if
// all are in backoff or have no claim row yet (unfenced, which it
// returns), ErrUnknownMachine if one is not a machine. It reads the
// candidates' states in one statement, and returns the processes of the
// claims it ended as Abandoned.
func (s *Session) takeOverFirst(ctx context.Context, tx *Tx, process string, candidates []uuid.UUID, c *checks) (_ claim, abandoned []string, unfenced []uuid.UUID, _ error) {
	if len(candidates) == 0 {
		return claim{}, nil, nil, fmt.Errorf("%w (process %q)", ErrNothingToDo, process)
	}
	c.last = false
	states, err := tx.q.WorkClaimStates(ctx, store.WorkClaimStatesParams{MachineIds: candidates, Process: process})
	if err != nil {
		return claim{}, nil, nil, fmt.Errorf("bmdb: Work(%q): reading the claims of %d candidates: %w", process, len(candidates), err)
	}
	for i, state := range states {
		if !state.Known {
			return claim{}, nil, nil, fmt.Errorf("%w: retrieve returned %s for %q, which is not in the machines table", ErrUnknownMachine, candidates[i], process)
		}
	}
	conflict := false
	for i, state := range states {
		machine := candidates[i]
		switch {
		case state.InBackoff:
			continue
		case !state.Fenced && !state.Holder.Valid:
			unfenced = append(unfenced, machine)
			continue
		case !state.Holder.Valid || state.HolderLive || state.Holder.UUID == s.id:
			conflict = true
			continue
		}
		abandoned, err := s.takeOver(ctx, tx, process, machine, state.Holder.UUID)
		if err != nil {
			return claim{}, nil, nil, err
		}
		if abandoned == nil { // the holder came back to life, or went: try the next
			conflict = true
			continue
		}
		got, _, err := s.claimMany(ctx, tx, process, []uuid.UUID{machine}, 1, c)
		if err != nil {
			return claim{}, nil, nil, err
		}
		if len(got) == 0 { // being claimed by another transaction
			conflict = true
			continue
		}
		return got[0], abandoned, nil, nil
	}
	if conflict {
		return claim{}, nil, unfenced, fmt.Errorf("%w (process %q)", ErrWorkConflict, process)
	}
	return claim{}, nil, unfenced, fmt.Errorf("%w (process %q)", ErrNothingToDo, process)
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
		err := s.transact(ctx, s.conn.batchTx, func(tx *Tx) error {
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
		})
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
// machines and got claimed, with err: the machines asked for, and
// conflicts and nothing-to-do apart.
func (c *Connection) recordClaims(process string, limit, claimed int, err error) {
	p := c.stats.process(process)
	p.asked.Add(int64(limit))
	switch {
	case errors.Is(err, ErrWorkConflict):
		p.conflicts.Add(1)
	case errors.Is(err, ErrProcessPaused):
		p.paused.Add(1)
	case errors.Is(err, ErrCapReached):
		p.capped.Add(1)
	case errors.Is(err, ErrNothingToDo):
		p.nothing.Add(1)
	case err != nil:
		return
	}
	p.calls.Add(1)
	p.claimed.Add(int64(claimed))
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
