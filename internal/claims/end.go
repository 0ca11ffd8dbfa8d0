package claims

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/txn"
)

// The end statements are WorkFinishMany (which checks the session as it
// runs, so that run last it is the check before COMMIT) and WorkEndMany,
// with WorkBackoffIntervals and WorkBackoffUpsertMany for the backoffs of
// failed claims (queries/internal).

// endInTx is the ends' part of a batch's transaction, all for the
// process: one multi-row statement per kind of end (Failed, Canceled,
// then Finished) deletes the claims the session still holds, with their
// history; failed claims' backoffs are set and finished ones' cleared. The
// commit callbacks of the Finishes run before their statement, a Shared
// once for all its calls, so that the statement, which checks the
// session, is the last of the attempt. A Finish whose claim the statement
// finds gone has its callback's writes in the transaction: it is marked
// lost for good and the attempt runs again (errLostFinish), without its
// callback. It returns the machines whose claims it ended unfinished
// (Canceled, Failed), which the batch's claims may take again.
func (q *queue) endInTx(ctx context.Context, tx *txn.Tx, reqs []*request) (ended []uuid.UUID, _ error) {
	kinds := map[store.WorkHistoryEvent][]*request{}
	for _, r := range reqs {
		r.end.Err = nil
		if r.end.gone {
			r.end.Err = q.lostError(r.end)
		}
		kinds[r.end.Event] = append(kinds[r.end.Event], r)
	}
	for _, event := range []store.WorkHistoryEvent{store.WorkHistoryEventFailed, store.WorkHistoryEventCanceled} {
		if rs := kinds[event]; len(rs) > 0 {
			if err := q.stopClaims(ctx, tx, event, rs); err != nil {
				return nil, err
			}
		}
	}
	if err := q.applyBackoffs(ctx, tx, kinds[store.WorkHistoryEventFailed]); err != nil {
		return nil, err
	}
	if err := q.finishClaims(ctx, tx, kinds[store.WorkHistoryEventFinished]); err != nil {
		return nil, err
	}
	for _, r := range reqs {
		if r.end.Err == nil && r.end.Event != store.WorkHistoryEventFinished {
			ended = append(ended, r.end.Claim.Machine)
		}
	}
	return ended, nil
}

// errLostFinish ends an attempt in which a Finish's commit callback ran
// but its claim was found gone: its writes must not commit.
var errLostFinish = fmt.Errorf("%w: a Finish's claim was gone after its commit ran", txn.ErrRerun)

// finishClaims runs the commit callbacks of the Finishes reqs not known
// to be lost, then ends their claims as Finished with one WorkFinishMany,
// which checks the session.
func (q *queue) finishClaims(ctx context.Context, tx *txn.Tx, reqs []*request) error {
	var live []*request
	for _, r := range reqs {
		if !r.end.gone {
			live = append(live, r)
		}
	}
	if len(live) == 0 {
		return nil
	}
	if err := commitEnds(tx, q.process, live); err != nil {
		return err
	}
	e := q.e
	machines, claims := claimKeys(live)
	rows, err := tx.Store().WorkFinishMany(ctx, store.WorkFinishManyParams{
		MachineIds: machines, ClaimIds: claims, Process: q.process, SessionID: e.lease.ID(),
		ComponentName: e.cfg.ComponentName, MaxIdleMs: e.lease.MaxIdleMs(),
	})
	if err != nil {
		return fmt.Errorf("bmdb: finishing %d claims of %q: %w", len(live), q.process, err)
	}
	if err := e.lease.Checked(tx, len(rows) > 0 && rows[0].Alive); err != nil {
		return err
	}
	done := make([]uuid.NullUUID, len(rows))
	for i, row := range rows {
		done[i] = row.ClaimID
	}
	if q.markLost(live, done) {
		for _, r := range live {
			if r.end.gone && r.claim != nil && !r.claimDone {
				giveUpClaim(r, r.end.Err) // no next machine for a Finish that did not finish
			}
		}
		return errLostFinish
	}
	return nil
}

// stopClaims ends claims as Failed or Canceled, with their causes, in one
// WorkEndMany.
func (q *queue) stopClaims(ctx context.Context, tx *txn.Tx, event store.WorkHistoryEvent, reqs []*request) error {
	machines, claims := claimKeys(reqs)
	causes := make([]string, len(reqs))
	for i, r := range reqs {
		causes[i] = r.end.Cause
	}
	ended, err := tx.Store().WorkEndMany(ctx, store.WorkEndManyParams{
		Event: event, ComponentName: q.e.cfg.ComponentName, Process: q.process, SessionID: q.e.lease.ID(),
		MachineIds: machines, ClaimIds: claims, Causes: causes,
	})
	if err != nil {
		return fmt.Errorf("bmdb: ending %d claims of %q as %s: %w", len(reqs), q.process, event, err)
	}
	q.markLost(reqs, ended)
	return nil
}

// applyBackoffs puts the held failed claims with a Backoff in backoff,
// each grown from its machine's previous interval, in one statement.
func (q *queue) applyBackoffs(ctx context.Context, tx *txn.Tx, fails []*request) error {
	var backed []*EndCall
	for _, r := range fails {
		if r.end.Err == nil && r.end.Backoff != nil {
			backed = append(backed, r.end)
		}
	}
	if len(backed) == 0 {
		return nil
	}
	ids := make([]uuid.UUID, len(backed))
	for i, e := range backed {
		ids[i] = e.Claim.Machine
	}
	prev, err := tx.Store().WorkBackoffIntervals(ctx, store.WorkBackoffIntervalsParams{Process: q.process, MachineIds: ids})
	if err != nil {
		return fmt.Errorf("bmdb: reading backoffs of %q: %w", q.process, err)
	}
	last := make(map[uuid.UUID]time.Duration, len(prev))
	for _, p := range prev {
		last[p.MachineID] = time.Duration(p.IntervalSeconds * float64(time.Second))
	}
	arg := store.WorkBackoffUpsertManyParams{MachineIds: ids, Process: q.process}
	for _, e := range backed {
		interval := e.Backoff.Next(last[e.Claim.Machine])
		arg.WaitSeconds = append(arg.WaitSeconds, e.Backoff.Wait(interval, rand.Float64()).Seconds())
		arg.Causes = append(arg.Causes, e.Cause)
		arg.IntervalSeconds = append(arg.IntervalSeconds, interval.Seconds())
	}
	if err := tx.Store().WorkBackoffUpsertMany(ctx, arg); err != nil {
		return fmt.Errorf("bmdb: setting backoffs of %q: %w", q.process, err)
	}
	return nil
}

// commitEnds runs the commit callbacks of the finished calls: each
// Finish's own, and each Shared once with its calls' Owners. An error
// names the machine (or the number of machines) and the process.
func commitEnds(tx *txn.Tx, process string, finished []*request) error {
	var shared []*Shared
	members := map[*Shared][]*request{}
	for _, r := range finished {
		e := r.end
		switch {
		case e.Shared != nil:
			if members[e.Shared] == nil {
				shared = append(shared, e.Shared)
			}
			members[e.Shared] = append(members[e.Shared], r)
		default:
			if err := callback([]*request{r}, func() error { return e.Commit(tx) }); err != nil {
				return fmt.Errorf("bmdb: Finish(%q) of %s: commit: %w", process, e.Claim.Machine, err)
			}
		}
	}
	for _, b := range shared {
		rs := members[b]
		owners := make([]any, len(rs))
		for i, r := range rs {
			owners[i] = r.end.Owner
		}
		if err := callback(rs, func() error { return b.Commit(tx, owners) }); err != nil {
			if len(rs) == 1 {
				return fmt.Errorf("bmdb: Finish(%q) of %s: batch commit: %w", process, rs[0].end.Claim.Machine, err)
			}
			return fmt.Errorf("bmdb: Finish(%q) of %d machines: batch commit: %w", process, len(rs), err)
		}
	}
	return nil
}

// claimKeys returns the machines and claim ids of the ends reqs.
func claimKeys(reqs []*request) (machines, claims []uuid.UUID) {
	machines, claims = make([]uuid.UUID, len(reqs)), make([]uuid.UUID, len(reqs))
	for i, r := range reqs {
		machines[i], claims[i] = r.end.Claim.Machine, r.end.Claim.ID
	}
	return machines, claims
}

// markLost gives ErrWorkLost to the ends whose claim is not among the
// claim ids an end statement returned, marks them gone for the batch's
// later attempts, and reports whether it found one. Claims, not machines:
// a session may end a stale Work and a newer claim of the same machine in
// one batch.
func (q *queue) markLost(reqs []*request, ended []uuid.NullUUID) bool {
	set := make(map[uuid.UUID]bool, len(ended))
	for _, c := range ended {
		if c.Valid {
			set[c.UUID] = true
		}
	}
	lost := false
	for _, r := range reqs {
		if !set[r.end.Claim.ID] {
			r.end.Err, r.end.gone, lost = q.lostError(r.end), true, true
		}
	}
	return lost
}

// lostError is ErrWorkLost for e.
func (q *queue) lostError(e *EndCall) error {
	return fmt.Errorf("%w: %q on %s is no longer held by session %s", ErrWorkLost, q.process, e.Claim.Machine, q.e.lease.ID())
}
