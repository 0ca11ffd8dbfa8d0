package bmdb

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/store"
)

// CommitGroup commits the results of many Works at once, for applications
// whose results can be written in one statement (an INSERT ... SELECT over
// the machines' ids, say). Finishes that one transaction groups together
// (concurrent Work.FinishWith calls of a session for one process) and that
// pass the same *CommitGroup are committed by one call of Commit with all
// their Works, instead of one callback each. A CommitGroup is safe for
// concurrent use and meant to be reused for every Finish of a kind.
type CommitGroup struct {
	// Commit applies the results of works inside tx; like Finish's commit,
	// it may run several times, must wrap errors with %w, and must not call
	// Work or the ends of the same session. If it fails, the Works are
	// finished one at a time (Commit called with one Work each), so that
	// only the failing ones fail. Required.
	Commit func(tx *Tx, works []*Work) error
}

// endRequest is one Finish, Cancel or Fail call in an end group.
type endRequest struct {
	w       *Work
	event   store.WorkHistoryEvent
	cause   string             // Fail
	backoff *Backoff           // Fail, optional
	commit  func(tx *Tx) error // Finish
	group   *CommitGroup       // FinishWith
	err     error              // the result, set by the group
}

// endGrouped ends r's claim in a group of the session's concurrent calls
// for its process, and returns r's own outcome; r's error is ErrWorkLost if
// its claim was gone, even if the group committed.
func (s *Session) endGrouped(ctx context.Context, r *endRequest) error {
	if err := s.inGroup(ctx, r.w.process, &groupOp{end: r}); err != nil {
		return err
	}
	return r.err
}

// recordEnd counts a member's committed end in the metrics.
func (s *Session) recordEnd(r *endRequest) {
	if r.err != nil {
		return
	}
	s.conn.metrics.workEvent(r.w.process, r.event)
	if r.event == store.WorkHistoryEventFailed && r.backoff != nil {
		s.conn.metrics.backoff(r.w.process)
	}
}

// endInTx is the body of the ends of a group, all of process: one
// multi-row statement per kind of end (Finished, Failed, Canceled) deletes
// the claims the session still holds, with their history; finished claims'
// backoffs are cleared and failed ones' set; then the commit callbacks of
// the finished Works run, a CommitGroup once for all its Works.
func (s *Session) endInTx(ctx context.Context, tx *Tx, process string, reqs []*endRequest) error {
	for _, r := range reqs {
		r.err = nil
	}
	if err := s.endClaims(ctx, tx, process, reqs); err != nil {
		return err
	}
	return commitEnds(tx, reqs)
}

// endClaims ends the claims of reqs, all of process, marking those no
// longer held.
func (s *Session) endClaims(ctx context.Context, tx *Tx, process string, reqs []*endRequest) error {
	kinds := map[store.WorkHistoryEvent][]*endRequest{}
	for _, r := range reqs {
		kinds[r.event] = append(kinds[r.event], r)
	}
	if f := kinds[store.WorkHistoryEventFinished]; len(f) > 0 {
		if err := s.finishClaims(ctx, tx, process, f); err != nil {
			return err
		}
	}
	for _, event := range []store.WorkHistoryEvent{store.WorkHistoryEventFailed, store.WorkHistoryEventCanceled} {
		if rs := kinds[event]; len(rs) > 0 {
			if err := s.stopClaims(ctx, tx, process, event, rs); err != nil {
				return err
			}
		}
	}
	return s.applyBackoffs(ctx, tx, process, kinds[store.WorkHistoryEventFailed])
}

// finishClaims ends claims as Finished and clears their backoffs, in one
// statement (WorkFinish for one claim, WorkFinishMany for several).
func (s *Session) finishClaims(ctx context.Context, tx *Tx, process string, reqs []*endRequest) error {
	if len(reqs) == 1 {
		w := reqs[0].w
		n, err := tx.q.WorkFinish(ctx, store.WorkFinishParams{
			MachineID: w.machine, Process: w.process, SessionID: s.id, ClaimID: w.claimID,
			ComponentName: s.conn.cfg.ComponentName,
		})
		if err != nil {
			return fmt.Errorf("bmdb: finishing %q on %s: %w", w.process, w.machine, err)
		}
		if n == 0 {
			reqs[0].err = w.lostError()
		}
		return nil
	}
	ended, err := s.finishMany(ctx, tx, process, worksOf(reqs))
	if err != nil {
		return fmt.Errorf("bmdb: finishing %d claims of %q: %w", len(reqs), process, err)
	}
	markLost(reqs, ended)
	return nil
}

// finishMany ends works, claims of process, as Finished and clears their
// backoffs, in one statement (WorkFinishMany), and returns the claim ids it
// ended: a Work whose claim id is missing no longer held its claim.
func (s *Session) finishMany(ctx context.Context, tx *Tx, process string, works []*Work) (map[uuid.UUID]bool, error) {
	machines, claims := claimKeys(works)
	ended, err := tx.q.WorkFinishMany(ctx, store.WorkFinishManyParams{
		MachineIds: machines, ClaimIds: claims, Process: process, SessionID: s.id, ComponentName: s.conn.cfg.ComponentName,
	})
	if err != nil {
		return nil, err
	}
	return claimSet(ended), nil
}

// stopClaims ends claims as Failed or Canceled, with their causes.
func (s *Session) stopClaims(ctx context.Context, tx *Tx, process string, event store.WorkHistoryEvent, reqs []*endRequest) error {
	ids, claims := claimKeys(worksOf(reqs))
	causes := make([]string, len(reqs))
	for i, r := range reqs {
		causes[i] = r.cause
	}
	ended, err := tx.q.WorkEndMany(ctx, store.WorkEndManyParams{
		Event: event, ComponentName: s.conn.cfg.ComponentName, Process: process, SessionID: s.id,
		MachineIds: ids, ClaimIds: claims, Causes: causes,
	})
	if err != nil {
		return fmt.Errorf("bmdb: ending %d claims of %q as %s: %w", len(reqs), process, event, err)
	}
	markLost(reqs, claimSet(ended))
	return nil
}

// applyBackoffs puts the held failed claims with a Backoff in backoff, each
// grown from its machine's previous interval, in one statement.
func (s *Session) applyBackoffs(ctx context.Context, tx *Tx, process string, fails []*endRequest) error {
	var backed []*endRequest
	for _, r := range fails {
		if r.err == nil && r.backoff != nil {
			backed = append(backed, r)
		}
	}
	if len(backed) == 0 {
		return nil
	}
	ids := make([]uuid.UUID, len(backed))
	for i, r := range backed {
		ids[i] = r.w.machine
	}
	prev, err := tx.q.WorkBackoffIntervals(ctx, store.WorkBackoffIntervalsParams{Process: process, MachineIds: ids})
	if err != nil {
		return fmt.Errorf("bmdb: reading backoffs of %q: %w", process, err)
	}
	last := make(map[uuid.UUID]time.Duration, len(prev))
	for _, p := range prev {
		last[p.MachineID] = time.Duration(p.IntervalSeconds * float64(time.Second))
	}
	arg := store.WorkBackoffUpsertManyParams{MachineIds: ids, Process: process}
	for _, r := range backed {
		interval := r.backoff.next(last[r.w.machine])
		arg.WaitSeconds = append(arg.WaitSeconds, r.backoff.wait(interval, rand.Float64()).Seconds())
		arg.Causes = append(arg.Causes, r.cause)
		arg.IntervalSeconds = append(arg.IntervalSeconds, interval.Seconds())
	}
	if err := tx.q.WorkBackoffUpsertMany(ctx, arg); err != nil {
		return fmt.Errorf("bmdb: setting backoffs of %q: %w", process, err)
	}
	return nil
}

// commitEnds runs the commit callbacks of the finished Works still held:
// each Finish's own, and each CommitGroup once with its Works.
func commitEnds(tx *Tx, reqs []*endRequest) error {
	var groups []*CommitGroup
	members := map[*CommitGroup][]*Work{}
	for _, r := range reqs {
		if r.err != nil || r.event != store.WorkHistoryEventFinished {
			continue
		}
		switch {
		case r.group != nil:
			if members[r.group] == nil {
				groups = append(groups, r.group)
			}
			members[r.group] = append(members[r.group], r.w)
		case r.commit != nil:
			if err := r.commit(tx); err != nil {
				return err
			}
		}
	}
	for _, g := range groups {
		if err := g.Commit(tx, members[g]); err != nil {
			return err
		}
	}
	return nil
}

// worksOf returns the Works of reqs.
func worksOf(reqs []*endRequest) []*Work {
	works := make([]*Work, len(reqs))
	for i, r := range reqs {
		works[i] = r.w
	}
	return works
}

// claimKeys returns the machines and claim ids of works.
func claimKeys(works []*Work) (machines, claims []uuid.UUID) {
	machines, claims = make([]uuid.UUID, len(works)), make([]uuid.UUID, len(works))
	for i, w := range works {
		machines[i], claims[i] = w.machine, w.claimID
	}
	return machines, claims
}

// claimSet returns the claim ids an end statement returned, as a set.
func claimSet(ended []uuid.NullUUID) map[uuid.UUID]bool {
	set := make(map[uuid.UUID]bool, len(ended))
	for _, c := range ended {
		set[c.UUID] = true
	}
	return set
}

// markLost gives ErrWorkLost to the members whose claim is not among the
// claims ended. Claims, not machines: a session may end a stale Work and a
// newer claim of the same machine in one group.
func markLost(reqs []*endRequest, ended map[uuid.UUID]bool) {
	for _, r := range reqs {
		if !ended[r.w.claimID] {
			r.err = r.w.lostError()
		}
	}
}
