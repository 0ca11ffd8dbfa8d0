package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"math/rand/v2"

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
	used       map[uuid.UUID]bool // candidates offered to a claim statement
	checks     *checks            // the attempt's session checks
	blocked    error              // ErrProcessPaused or ErrCapReached, if the last claim statement found so

	// What the claim statements found of the candidates they were offered:
	// those without a claim row, and the claims of expired sessions among
	// them (or holding a slot of a capped process) that the pass takes over.
	sweep           bool // the first statement also finds every expired claim of the process
	unfenced        map[uuid.UUID]bool
	expiredMachines []uuid.UUID
	expiredSessions []uuid.UUID
	abandoned       []string // processes of the claims its takeovers ended
}

func (b *batcher) newClaimPass(reqs []*request, c *checks) *claimPass {
	return &claimPass{b: b, reqs: reqs, candidates: make([][]uuid.UUID, len(reqs)), used: map[uuid.UUID]bool{},
		checks: c, unfenced: map[uuid.UUID]bool{}}
}

// run runs every request's retrieve; then, in rounds of one statement,
// claims for each the first of its candidates that no other request took
// and that are free, up to its limit (the first statement is also the
// session check, so that the retrievals' snapshot is as fresh as can be
// when the candidates are locked). If that statement found claims of
// expired sessions among the candidates (or holding the slots of a capped
// process), it claimed nothing: the pass takes those sessions over, which
// ends their claims as Abandoned, and claims again, the freed machines
// first, so that a dead worker's machines are worked again at the first
// claim that sees them. Then each request left with none gets its outcome
// (diagnose): ErrProcessPaused or ErrCapReached, ErrNothingToDo,
// ErrWorkConflict or ErrUnknownMachine; any other error fails the
// attempt. A request left short that was offered a candidate without a
// claim row has the rows of all its candidates made, once, and the
// attempt runs again (errRerun): its snapshot cannot see them.
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
	}
	p.sweep = b.sweepDue()
	if err := p.rounds(ctx, tx, func(uuid.UUID) bool { return true }, true); err != nil {
		return err
	}
	if len(p.expiredSessions) > 0 {
		if err := p.takeOver(ctx, tx); err != nil {
			return err
		}
	}
	if !p.checks.first {
		if err := b.s.check(ctx, tx); err != nil {
			return err
		}
		p.checks.first = true
	}
	return p.diagnose(ctx, tx)
}

// rounds claims, in rounds of one statement, for each request the first
// of its untried candidates (among those may allows) that are free, up to
// its limit. Each request offers the statement as many candidates as it
// needs, and the next round the next ones, so that each gets its own;
// on PostgreSQL a request alone offers all its candidates, of which the
// statement claims the first free ones, in one round: PostgreSQL locks
// only the rows it claims. On CockroachDB a locking read locks every row
// its scan fetches (WorkClaimMany), so a statement is offered no more
// candidates than it may claim, however many were retrieved. With
// preferExpired, a statement that finds claims of expired sessions among
// the candidates claims nothing and ends the rounds (run takes those over).
func (p *claimPass) rounds(ctx context.Context, tx *Tx, may func(uuid.UUID) bool, preferExpired bool) error {
	next := make([]int, len(p.reqs))
	lone := len(p.reqs) == 1 && p.b.s.conn.engine != engineCockroach
	for {
		var picks []uuid.UUID
		owner := map[uuid.UUID]*claimRequest{}
		want := 0
		for i, r := range p.reqs {
			need := r.claim.limit - len(r.claim.claims)
			want += max(need, 0)
			offer := need
			if lone {
				offer = len(p.candidates[i])
			}
			for ; offer > 0 && need > 0 && next[i] < len(p.candidates[i]); next[i]++ {
				m := p.candidates[i][next[i]]
				if p.used[m] || p.unfenced[m] || !may(m) {
					continue
				}
				p.used[m], owner[m] = true, r.claim
				picks = append(picks, m)
				offer--
			}
		}
		if len(picks) == 0 && !p.sweep {
			return nil
		}
		got, st, err := p.b.s.claimMany(ctx, tx, p.b.process, claimArgs{
			offer: picks, limit: min(want, len(picks)), preferExpired: preferExpired, sweep: p.sweep,
		}, p.checks)
		if err != nil {
			return err
		}
		p.sweep = false
		for _, m := range st.unfenced {
			p.unfenced[m] = true
		}
		if preferExpired && len(st.expiredSessions) > 0 {
			p.expiredMachines, p.expiredSessions = st.expiredMachines, st.expiredSessions
			return nil
		}
		if p.blocked = st.controls.blocked(); p.blocked != nil && len(got) == 0 {
			return nil
		}
		for _, c := range got {
			owner[c.machine].claims = append(owner[c.machine].claims, c)
		}
		if len(st.unfenced) > 0 && p.short() {
			// Candidates without claim rows: a request still short has
			// them made, with its other candidates', and runs again
			// (diagnose), rather than offer them one round at a time.
			return nil
		}
	}
}

// short reports whether a request wants more machines than it claimed and
// was offered a candidate without a claim row, whose rows it has not made
// yet in this batch.
func (p *claimPass) short() bool {
	for i, r := range p.reqs {
		c := r.claim
		if len(c.claims) >= c.limit || c.fenced {
			continue
		}
		for _, m := range p.candidates[i] {
			if p.unfenced[m] {
				return true
			}
		}
	}
	return false
}

// takeOver supersedes the expired sessions the first claim statement
// found holding candidates (or slots), each skipped if another takeover or
// a GC is superseding it, and claims again: the machines they held first,
// then every candidate not claimed.
func (p *claimPass) takeOver(ctx context.Context, tx *Tx) error {
	s, process := p.b.s, p.b.process
	for _, holder := range p.expiredSessions {
		abandoned, err := s.takeOver(ctx, tx, process, holder)
		if err != nil {
			return err
		}
		p.abandoned = append(p.abandoned, abandoned...)
	}
	if len(p.reqs) > 0 {
		p.reqs[0].claim.abandoned = p.abandoned
	}
	first := map[uuid.UUID]bool{}
	for _, m := range p.expiredMachines {
		first[m] = true
	}
	for i, cands := range p.candidates {
		reordered := make([]uuid.UUID, 0, len(cands))
		for _, m := range cands {
			if first[m] {
				reordered = append(reordered, m)
			}
		}
		for _, m := range cands {
			if !first[m] {
				reordered = append(reordered, m)
			}
		}
		p.candidates[i] = reordered
	}
	claimed := p.claimedMachines()
	clear(p.used)
	p.blocked = nil
	return p.rounds(ctx, tx, func(m uuid.UUID) bool { return !claimed[m] }, false)
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

// diagnose gives each request left with no claim its outcome: the
// controls' (paused, at its cap), or, once its candidates without a claim
// row have had theirs made (and the attempt ran again: errRerun), what its
// candidates' states say: ErrWorkConflict if one is claimed by a live
// session or being claimed or superseded by another transaction (machines
// others are working on), ErrUnknownMachine if none is and one is not a
// machine, ErrNothingToDo otherwise (all in backoff, or none).
func (p *claimPass) diagnose(ctx context.Context, tx *Tx) error {
	s, process := p.b.s, p.b.process
	claimed := p.claimedMachines()
	for i, r := range p.reqs {
		c := r.claim
		if len(c.claims) > 0 {
			continue
		}
		if p.blocked != nil {
			// Paused, or no slot free under the cap.
			c.err = fmt.Errorf("%w (process %q)", p.blocked, process)
			continue
		}
		var rest []uuid.UUID
		unfenced := false
		for _, m := range p.candidates[i] {
			if !claimed[m] {
				rest = append(rest, m)
				unfenced = unfenced || p.unfenced[m]
			}
		}
		if unfenced && !c.fenced {
			if err := p.b.fences.ensure(ctx, rest); err != nil {
				return fmt.Errorf("bmdb: Work(%q): %w", process, err)
			}
			c.fenced = true
			return errRerun
		}
		err := s.whyNothing(ctx, tx, process, rest)
		if err != nil && !isOutcome(err) {
			return err
		}
		if errors.Is(err, ErrNothingToDo) && len(rest) < len(p.candidates[i]) {
			// Taken by other calls of this batch: claimed.
			err = fmt.Errorf("%w (process %q)", ErrWorkConflict, process)
		}
		c.err = err
	}
	return nil
}

// isOutcome reports whether err is a claim request's own outcome rather
// than a failure of the attempt.
func isOutcome(err error) bool {
	return errors.Is(err, ErrNothingToDo) || errors.Is(err, ErrWorkConflict) || errors.Is(err, ErrUnknownMachine)
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
	if err := p.rounds(ctx, tx, func(m uuid.UUID) bool { return set[m] }, false); err != nil {
		return err
	}
	for _, r := range p.reqs {
		if len(r.claim.claims) > 0 {
			r.claim.err = nil
		}
	}
	return nil
}

// claimArgs are what one claim statement is given.
type claimArgs struct {
	offer         []uuid.UUID // the candidates it may lock and claim, in order
	limit         int         // the most it claims
	preferExpired bool        // claim nothing if it finds claims of expired sessions
	sweep         bool        // find every claim of the process held by an expired session
}

// claimState is what a claim statement found besides its claims.
type claimState struct {
	controls        controls
	unfenced        []uuid.UUID // offered candidates without a claim row
	expiredMachines []uuid.UUID // offered candidates held by expired sessions (with sweep, any of the process's)
	expiredSessions []uuid.UUID // those sessions, and expired holders of the process's slots
}

// claimMany claims, with one claim statement, up to a.limit of a.offer
// (the first, in their order) that are neither claimed for process nor in
// backoff for it nor being claimed or ended by another transaction, as the
// process's controls allow, and returns the claims made, in the order of
// the offer, and what the statement found (claimState). The statement
// checks the session too (checked, c): it fails with the session's error
// if it has ended. A process without a controls row has it made, and the
// attempt runs again (errRerun). On CockroachDB the statement is
// WorkClaimManyArbitrated, whose slots are not locked (lock at fetch would
// lock them all), on PostgreSQL WorkClaimMany.
//
// Under snapshot isolation (PostgreSQL's REPEATABLE READ) the statement
// fails with 40001 if one of the offered machines was claimed or ended by
// a transaction that committed after this one's snapshot (first committer
// wins: WorkClaimMany), or the process's controls were changed: a
// retrieval that read before that commit returned it. claimMany returns
// that as errStale: the attempt runs again, at once, with a snapshot that
// sees the commit, and its retrievals do too.
func (s *Session) claimMany(ctx context.Context, tx *Tx, process string, a claimArgs, c *checks) ([]claim, claimState, error) {
	c.last = false
	rows, err := s.claimStatement(ctx, tx, process, a)
	switch {
	case err == nil:
	case s.conn.batchTx == snapshot && sqlState(err) == codeSerializationFailure:
		s.conn.stats.process(process).stale.Add(1)
		return nil, claimState{}, fmt.Errorf("%w: %w", errStale, err)
	default:
		return nil, claimState{}, fmt.Errorf("bmdb: Work(%q): claiming %d machines: %w", process, len(a.offer), err)
	}
	if err := s.checked(c, len(rows) > 0 && rows[0].Alive); err != nil { // the statement is a session check too
		return nil, claimState{}, err
	}
	head := rows[0]
	st := claimState{
		controls:        controls{paused: head.Paused, cap: head.ClaimCap.Int64, freeSlots: head.FreeSlots},
		unfenced:        head.Unfenced,
		expiredMachines: head.ExpiredMachines,
		expiredSessions: head.ExpiredSessions,
	}
	if !head.Controlled {
		if err := s.ensureControls(ctx, process); err != nil {
			return nil, st, fmt.Errorf("bmdb: Work(%q): %w", process, err)
		}
		return nil, st, errRerun
	}
	s.conn.stats.process(process).sawControls(st.controls)
	byMachine := make(map[uuid.UUID]claim, len(rows))
	for _, r := range rows {
		if r.MachineID.Valid {
			byMachine[r.MachineID.UUID] = claim{machine: r.MachineID.UUID, id: r.ClaimID.UUID, token: r.FencingToken.Int64}
		}
	}
	var claimed []claim
	for _, m := range a.offer {
		if c, ok := byMachine[m]; ok {
			claimed = append(claimed, c)
		}
	}
	return claimed, st, nil
}

// claimStatement runs the engine's claim statement with a.
func (s *Session) claimStatement(ctx context.Context, tx *Tx, process string, a claimArgs) ([]store.WorkClaimManyRow, error) {
	offer := a.offer
	if offer == nil {
		offer = []uuid.UUID{}
	}
	if s.conn.engine != engineCockroach {
		return tx.q.WorkClaimMany(ctx, store.WorkClaimManyParams{
			Offer: offer, Process: process, SessionID: s.id, ComponentName: s.conn.cfg.ComponentName,
			MaxClaims: int64(a.limit), PreferExpired: a.preferExpired, Sweep: a.sweep, MaxIdleMs: s.maxIdleMs(),
		})
	}
	rows, err := tx.q.WorkClaimManyArbitrated(ctx, store.WorkClaimManyArbitratedParams{
		Offer: offer, Process: process, SessionID: s.id, ComponentName: s.conn.cfg.ComponentName,
		MaxClaims: int64(a.limit), PreferExpired: a.preferExpired, Sweep: a.sweep, MaxIdleMs: s.maxIdleMs(),
		SlotStart: rand.Int64N(MaxCap),
	})
	out := make([]store.WorkClaimManyRow, len(rows))
	for i, r := range rows {
		out[i] = store.WorkClaimManyRow(r)
	}
	return out, err
}

// controls are a process's fleet controls as a claim statement found them.
type controls struct {
	paused    bool
	cap       int64 // 0: none
	freeSlots int64 // slots below the cap the statement took
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

// whyNothing says why none of candidates, which a claim statement could
// not claim, can be claimed, reading their states in one statement:
// ErrWorkConflict if one is claimed by a live session or being claimed
// (or superseded) by another transaction, ErrUnknownMachine if none is and
// one is not a machine, ErrNothingToDo if all are in backoff or have no
// claim row yet (or there are none).
func (s *Session) whyNothing(ctx context.Context, tx *Tx, process string, candidates []uuid.UUID) error {
	if len(candidates) == 0 {
		return fmt.Errorf("%w (process %q)", ErrNothingToDo, process)
	}
	states, err := tx.q.WorkClaimStates(ctx, store.WorkClaimStatesParams{MachineIds: candidates, Process: process})
	if err != nil {
		return fmt.Errorf("bmdb: Work(%q): reading the claims of %d candidates: %w", process, len(candidates), err)
	}
	var unknown error
	for i, state := range states {
		switch {
		case !state.Known:
			if unknown == nil {
				unknown = fmt.Errorf("%w: retrieve returned %s for %q, which is not in the machines table", ErrUnknownMachine, candidates[i], process)
			}
		case state.InBackoff:
		case state.Holder.Valid || state.Fenced:
			// Held (by a live session, by this one, or by an expired one
			// another transaction is superseding), or its claim row is
			// locked by a claim or an end in flight.
			return fmt.Errorf("%w (process %q)", ErrWorkConflict, process)
		}
	}
	if unknown != nil {
		return unknown
	}
	return fmt.Errorf("%w (process %q)", ErrNothingToDo, process)
}

// takeOver supersedes the expired session holder: it locks the session
// row, ends all its claims as Abandoned and deletes it (see Mechanism in
// the package doc for how this orders the holder's open transactions). It
// returns the processes of the claims ended, none if holder is alive, gone
// by now, or being superseded by another transaction (SKIP LOCKED).
func (s *Session) takeOver(ctx context.Context, tx *Tx, process string, holder uuid.UUID) ([]string, error) {
	_, err := tx.q.SessionLockIfExpired(ctx, holder)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bmdb: Work(%q): taking over from session %s: %w", process, holder, err)
	}
	abandoned, _, err := supersede(ctx, tx, []uuid.UUID{holder})
	if err != nil {
		return nil, fmt.Errorf("bmdb: Work(%q): taking over from session %s: %w", process, holder, err)
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
