package claims

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/lease"
	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/txn"
)

// The claim statement is WorkClaimMany (queries/internal/work.sql, whose
// comment is its contract), or, on CockroachDB, WorkClaimManyArbitrated,
// whose slots are not locked. One statement claims for every call of a
// batch in a round; this file decides what each round is offered, and what
// a call gets when it gets nothing.

// loneOffer is how many candidates per machine it needs a call alone
// offers a claim statement on PostgreSQL.
const loneOffer = 16

// claimPass is the claims' part of one attempt of a batch's transaction,
// all for one process: the calls, their candidates, and how far each got.
// Owned by the goroutine running the batch.
type claimPass struct {
	q          *queue
	tok        *pickToken // the batch's place in the queue's pick book
	steered    []bool     // per call: the pick book kept it from a candidate
	reqs       []*request
	candidates [][]uuid.UUID      // each call's, distinct, in its order
	used       map[uuid.UUID]bool // candidates offered to a claim statement
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

func (q *queue) newClaimPass(reqs []*request, tok *pickToken, sweep bool) *claimPass {
	return &claimPass{q: q, tok: tok, reqs: reqs, sweep: sweep, candidates: make([][]uuid.UUID, len(reqs)), used: map[uuid.UUID]bool{},
		unfenced: map[uuid.UUID]bool{}, steered: make([]bool, len(reqs))}
}

// run runs every call's retrieve; then, in rounds of one statement, claims
// for each the first of its candidates that no other call took and that
// are free, up to its limit (the first statement is also the session
// check, so that the retrievals' snapshot is as fresh as can be when the
// candidates are locked). If that statement found claims of expired
// sessions among the candidates (or holding the slots of a capped
// process), it claimed nothing: the pass takes those sessions over, which
// ends their claims as Abandoned, and claims again, the freed machines
// first, so that a dead worker's machines are worked again at the first
// claim that sees them. Then each call left with none gets its outcome
// (diagnose): ErrProcessPaused or ErrCapReached, ErrNothingToDo,
// ErrWorkConflict or ErrUnknownMachine; any other error fails the
// attempt. A call left short that was offered a candidate without a claim
// row has the rows of all its candidates made (each candidate's once per
// call), and the attempt runs again (txn.ErrRerun): its snapshot cannot
// see them.
func (p *claimPass) run(ctx context.Context, tx *txn.Tx) error {
	for i, r := range p.reqs {
		c := r.claim
		c.Claims, c.Abandoned, c.Err = nil, nil, nil
		var ids []uuid.UUID
		err := callback(p.reqs[i:i+1], func() (err error) {
			ids, err = c.Retrieve(tx)
			return err
		})
		if err != nil {
			r.claimFailed = true
			return fmt.Errorf("bmdb: Work(%q): retrieve: %w", p.q.process, err)
		}
		p.candidates[i] = distinct(ids)
	}
	if err := p.rounds(ctx, tx, func(uuid.UUID) bool { return true }, true); err != nil {
		return err
	}
	if len(p.expiredSessions) > 0 {
		if err := p.takeOver(ctx, tx); err != nil {
			return err
		}
	}
	if !tx.EverChecked() {
		if err := p.q.e.lease.Check(ctx, tx); err != nil {
			return err
		}
	}
	return p.diagnose(ctx, tx)
}

// rounds claims, in rounds of one statement, for each call the first of
// its untried candidates (among those may allows) that are free, up to
// its limit. Each call offers the statement as many candidates as it
// needs, and the next round the next ones, so that each gets its own; on
// PostgreSQL a call alone offers loneOffer candidates per machine it
// needs, of which the statement claims the first free ones: PostgreSQL
// locks only the rows it claims, and a claim's cost grows with what it is
// offered. On CockroachDB a locking read locks every row its scan fetches
// (WorkClaimMany), so a statement is offered no more candidates than it
// may claim, however many were retrieved. With
// preferExpired, a statement that finds claims of expired sessions among
// what it was offered claims nothing and ends the rounds (run takes those
// over).
func (p *claimPass) rounds(ctx context.Context, tx *txn.Tx, may func(uuid.UUID) bool, preferExpired bool) error {
	next := make([]int, len(p.reqs))
	lone := len(p.reqs) == 1 && !p.q.e.cfg.Cockroach
	for {
		var picks []uuid.UUID
		owner := map[uuid.UUID]*ClaimCall{}
		want := 0
		for i, r := range p.reqs {
			need := r.claim.Limit - len(r.claim.Claims)
			want += max(need, 0)
			offer := need
			if lone {
				offer = need * loneOffer
			}
			for ; offer > 0 && need > 0 && next[i] < len(p.candidates[i]); next[i]++ {
				m := p.candidates[i][next[i]]
				if p.used[m] || p.unfenced[m] || !may(m) {
					continue
				}
				if !p.q.picks.offer(p.tok, m) {
					p.steered[i] = true // another batch of the session has it
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
		got, st, err := p.q.claimMany(ctx, tx, claimArgs{
			offer: picks, limit: min(want, len(picks)), preferExpired: preferExpired, sweep: p.sweep,
		})
		if err != nil {
			return err
		}
		if !p.q.e.cfg.Cockroach {
			// PostgreSQL locked and wrote only what it claimed: what it
			// was offered and did not claim cannot make another batch's
			// pick stale, and is free to offer.
			claimed := make(map[uuid.UUID]bool, len(got))
			for _, c := range got {
				claimed[c.Machine] = true
			}
			var unclaimed []uuid.UUID
			for _, m := range picks {
				if !claimed[m] {
					unclaimed = append(unclaimed, m)
				}
			}
			p.q.picks.withdraw(p.tok, unclaimed)
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
			owner[c.Machine].Claims = append(owner[c.Machine].Claims, c)
		}
		if len(st.unfenced) > 0 && p.short() {
			// Candidates without claim rows: a call still short has them
			// made, with its other candidates', and runs again
			// (diagnose), rather than offer them one round at a time.
			return nil
		}
	}
}

// short reports whether a call wants more machines than it claimed and
// was offered a candidate without a claim row, whose row it has not made
// yet in this batch.
func (p *claimPass) short() bool {
	for i, r := range p.reqs {
		c := r.claim
		if len(c.Claims) >= c.Limit {
			continue
		}
		for _, m := range p.candidates[i] {
			if p.unfenced[m] && !c.fenced[m] {
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
func (p *claimPass) takeOver(ctx context.Context, tx *txn.Tx) error {
	for _, holder := range p.expiredSessions {
		abandoned, err := lease.TakeOver(ctx, tx, holder)
		if err != nil {
			return fmt.Errorf("bmdb: Work(%q): %w", p.q.process, err)
		}
		p.abandoned = append(p.abandoned, abandoned...)
	}
	p.reqs[0].claim.Abandoned = p.abandoned
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
		for _, c := range r.claim.Claims {
			claimed[c.Machine] = true
		}
	}
	return claimed
}

// diagnose gives each call left with no claim its outcome: the controls'
// (paused, at its cap), or, once its candidates without a claim row have
// had theirs made (and the attempt ran again: txn.ErrRerun), what its
// candidates' states say (whyNothing).
func (p *claimPass) diagnose(ctx context.Context, tx *txn.Tx) error {
	process := p.q.process
	claimed := p.claimedMachines()
	for i, r := range p.reqs {
		c := r.claim
		if len(c.Claims) > 0 {
			continue
		}
		if p.blocked != nil {
			// Paused, or no slot free under the cap.
			c.Err = fmt.Errorf("%w (process %q)", p.blocked, process)
			continue
		}
		var rest []uuid.UUID
		unfenced := false
		for _, m := range p.candidates[i] {
			if !claimed[m] {
				rest = append(rest, m)
				// Each candidate's row is made once per call: an attempt
				// after a rerun may retrieve new candidates (others took
				// the first ones meanwhile), whose rows it makes too.
				unfenced = unfenced || (p.unfenced[m] && !c.fenced[m])
			}
		}
		if unfenced {
			if err := p.q.makeClaimRows(ctx, rest); err != nil {
				return fmt.Errorf("bmdb: Work(%q): %w", process, err)
			}
			if c.fenced == nil {
				c.fenced = make(map[uuid.UUID]bool, len(rest))
			}
			for _, m := range rest {
				c.fenced[m] = true
			}
			return fmt.Errorf("%w: claim rows made", txn.ErrRerun)
		}
		err := whyNothing(ctx, tx, process, rest)
		if !isOutcome(err) {
			return err
		}
		if errors.Is(err, ErrNothingToDo) && (len(rest) < len(p.candidates[i]) || p.steered[i]) {
			// Taken by other calls of this batch, or offered by another
			// batch of the session: claimed, or being claimed.
			err = fmt.Errorf("%w (process %q)", ErrWorkConflict, process)
		}
		c.Err = err
	}
	return nil
}

// isOutcome reports whether err is a claim call's own outcome rather than
// a failure of the attempt.
func isOutcome(err error) bool {
	return errors.Is(err, ErrNothingToDo) || errors.Is(err, ErrWorkConflict) || errors.Is(err, ErrUnknownMachine)
}

// claimFreed claims, for the calls that want more, those of their
// candidates that the batch's ends freed (Canceled or Failed: not
// Finished, whose result the retrievals, run before the ends, did not
// see): tried before the ends ran, they were this session's own claims
// then. If the claims found the process at its cap, the ends freed slots
// too: every candidate not claimed is tried again.
func (p *claimPass) claimFreed(ctx context.Context, tx *txn.Tx, freed []uuid.UUID) error {
	if len(freed) == 0 {
		return nil
	}
	set := make(map[uuid.UUID]bool, len(freed))
	if errors.Is(p.blocked, ErrCapReached) {
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
		if len(r.claim.Claims) > 0 {
			r.claim.Err = nil
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
// (the first, in their order) that are neither claimed for the process nor
// in backoff for it nor being claimed or ended by another transaction, as
// the process's controls allow, and returns the claims made, in the order
// of the offer, and what the statement found (claimState). The statement
// checks the session too (lease.Checked): it fails with the session's
// error if it has ended. A process without a controls row has it made,
// and the attempt runs again (txn.ErrRerun).
//
// Under snapshot isolation (PostgreSQL's REPEATABLE READ) the statement
// fails with 40001 if one of the offered machines was claimed or ended by
// a transaction that committed after this one's snapshot (first committer
// wins: WorkClaimMany), or the process's controls were changed: a
// retrieval that read before that commit returned it. claimMany returns
// that as errStale: the attempt runs again, at once, with a snapshot that
// sees the commit, and its retrievals do too.
func (q *queue) claimMany(ctx context.Context, tx *txn.Tx, a claimArgs) ([]Claim, claimState, error) {
	rows, err := q.claimStatement(ctx, tx, a)
	switch {
	case err == nil:
	case q.e.cfg.Isolation == txn.Snapshot && dbconn.SQLState(err) == dbconn.CodeSerializationFailure:
		q.e.counters.Process(q.process).Stale.Add(1)
		return nil, claimState{}, fmt.Errorf("%w: %w", errStale, err)
	default:
		return nil, claimState{}, fmt.Errorf("bmdb: Work(%q): claiming %d machines: %w", q.process, len(a.offer), err)
	}
	if err := q.e.lease.Checked(tx, len(rows) > 0 && rows[0].Alive); err != nil { // the statement is a session check too
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
		if err := q.makeControlsRow(ctx); err != nil {
			return nil, st, fmt.Errorf("bmdb: Work(%q): %w", q.process, err)
		}
		return nil, st, fmt.Errorf("%w: controls row made", txn.ErrRerun)
	}
	q.e.counters.Process(q.process).SawControls(st.controls.paused, st.controls.cap)
	byMachine := make(map[uuid.UUID]Claim, len(rows))
	for _, r := range rows {
		if r.MachineID.Valid {
			byMachine[r.MachineID.UUID] = Claim{Machine: r.MachineID.UUID, ID: r.ClaimID.UUID, Token: r.FencingToken.Int64}
		}
	}
	var claimed []Claim
	for _, m := range a.offer {
		if c, ok := byMachine[m]; ok {
			claimed = append(claimed, c)
		}
	}
	return claimed, st, nil
}

// claimStatement runs the engine's claim statement with a.
func (q *queue) claimStatement(ctx context.Context, tx *txn.Tx, a claimArgs) ([]store.WorkClaimManyRow, error) {
	e := q.e
	offer := a.offer
	if offer == nil {
		offer = []uuid.UUID{}
	}
	if !e.cfg.Cockroach {
		return tx.Store().WorkClaimMany(ctx, store.WorkClaimManyParams{
			Offer: offer, Process: q.process, SessionID: e.lease.ID(), ComponentName: e.cfg.ComponentName,
			MaxClaims: int64(a.limit), PreferExpired: a.preferExpired, Sweep: a.sweep, MaxIdleMs: e.lease.MaxIdleMs(),
		})
	}
	rows, err := tx.Store().WorkClaimManyArbitrated(ctx, store.WorkClaimManyArbitratedParams{
		Offer: offer, Process: q.process, SessionID: e.lease.ID(), ComponentName: e.cfg.ComponentName,
		MaxClaims: int64(a.limit), PreferExpired: a.preferExpired, Sweep: a.sweep, MaxIdleMs: e.lease.MaxIdleMs(),
		SlotStart: rand.Int64N(1 << 30),
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
var errStale = fmt.Errorf("%w: a candidate was claimed or ended after the snapshot", txn.ErrRerun)

// whyNothing says why none of candidates, which a claim statement could
// not claim, can be claimed, reading their states in one statement:
// ErrWorkConflict if one is claimed by a live session or being claimed
// (or superseded) by another transaction, ErrUnknownMachine if none is and
// one is not a machine, ErrNothingToDo if all are in backoff or have no
// claim row yet (or there are none).
func whyNothing(ctx context.Context, tx *txn.Tx, process string, candidates []uuid.UUID) error {
	if len(candidates) == 0 {
		return fmt.Errorf("%w (process %q)", ErrNothingToDo, process)
	}
	states, err := tx.Store().WorkClaimStates(ctx, store.WorkClaimStatesParams{MachineIds: candidates, Process: process})
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

// sweepDue reports whether the next batch's claim statements should find
// every claim of the process held by an expired session, not only those
// among its candidates (runBatch), and notes it: once every quarter of a
// session interval, so that a dead worker's claims of the process end
// about that soon after its deadline whatever the retrievals return, at
// the cost of reading the process's claims (work_process_idx) that often.
func (q *queue) sweepDue() bool {
	now := time.Now().UnixNano()
	last := q.lastSweep.Load()
	return now-last >= int64(q.e.lease.Interval()/4) && q.lastSweep.CompareAndSwap(last, now)
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
