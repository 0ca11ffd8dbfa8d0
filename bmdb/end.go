package bmdb

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/store"
)

// SharedCommit commits the results of several Works in one call, for
// applications whose results can be written in one statement (an INSERT
// ... SELECT over the machines' ids, say). The Finishes of one batch (see
// the package doc) that pass the same *SharedCommit through CommitShared
// are committed by one call with all their Works. Make one with
// NewSharedCommit for each kind of result, once, and reuse it: a new one
// per Finish batches nothing. Safe for concurrent use.
type SharedCommit struct {
	commit func(tx *Tx, works []*Work) error
}

// NewSharedCommit returns a SharedCommit that applies the results of works
// inside tx with commit. Like Finish's commit, commit may run several
// times, must wrap errors with %w, and must not call Work or the ends of
// the same session. If it fails, its Works are finished again one at a
// time (commit called with one Work each), so that only the Works it
// refuses fail. It returns nil if commit is nil.
func NewSharedCommit(commit func(tx *Tx, works []*Work) error) *SharedCommit {
	if commit == nil {
		return nil
	}
	return &SharedCommit{commit: commit}
}

// FinishOption changes how Finish commits a Work's result.
type FinishOption struct {
	batch *SharedCommit
}

// CommitShared is the FinishOption that commits the Work's result with b,
// once for all the Works of its batch that pass b, instead of with
// Finish's commit, which must then be nil.
func CommitShared(b *SharedCommit) FinishOption { return FinishOption{batch: b} }

// endRequest is a Finish, Cancel or Fail call.
type endRequest struct {
	w       *Work
	event   store.WorkHistoryEvent
	cause   string             // Fail
	backoff *Backoff           // Fail, optional
	commit  func(tx *Tx) error // Finish without CommitShared
	batch   *SharedCommit      // Finish with CommitShared
	err     error              // the outcome: ErrWorkLost if the claim was gone
	gone    bool               // an attempt found the claim gone: so are the later ones'
}

// recordEnd counts a committed end in the metrics.
func (s *Session) recordEnd(r *endRequest) {
	if r.err != nil {
		return
	}
	s.conn.stats.event(r.w.process, r.event)
	if r.event == store.WorkHistoryEventFailed && r.backoff != nil {
		s.conn.stats.process(r.w.process).backoffs.Add(1)
	}
}

// endInTx is the ends' part of a batch's transaction, all for process: one
// multi-row statement per kind of end (Failed, Canceled, then Finished)
// deletes the claims the session still holds, with their history; failed
// claims' backoffs are set and finished ones' cleared. The commit callbacks
// of the Finishes run before their statement, a SharedCommit once for all
// its Works, so that the statement, which checks the session (checked, c),
// is the last of the attempt. A Finish whose claim the statement finds
// gone has its callback's writes in the transaction: it is marked lost for
// good and the attempt runs again (errLostFinish), without its callback.
// It returns the machines whose claims it ended.
func (s *Session) endInTx(ctx context.Context, tx *Tx, process string, reqs []*request, c *checks) (ended []uuid.UUID, _ error) {
	kinds := map[store.WorkHistoryEvent][]*request{}
	for _, r := range reqs {
		r.end.err = nil
		if r.end.gone {
			r.end.err = r.end.w.lostError()
		}
		kinds[r.end.event] = append(kinds[r.end.event], r)
	}
	for _, event := range []store.WorkHistoryEvent{store.WorkHistoryEventFailed, store.WorkHistoryEventCanceled} {
		if rs := kinds[event]; len(rs) > 0 {
			c.last = false
			if err := s.stopClaims(ctx, tx, process, event, rs); err != nil {
				return nil, err
			}
		}
	}
	if err := s.applyBackoffs(ctx, tx, process, kinds[store.WorkHistoryEventFailed], c); err != nil {
		return nil, err
	}
	if err := s.finishClaims(ctx, tx, process, kinds[store.WorkHistoryEventFinished], c); err != nil {
		return nil, err
	}
	for _, r := range reqs {
		if r.end.err == nil {
			ended = append(ended, r.end.w.machine)
		}
	}
	return ended, nil
}

// errLostFinish ends an attempt in which a Finish's commit callback ran
// but its claim was found gone: its writes must not commit.
var errLostFinish = fmt.Errorf("%w: a Finish's claim was gone after its commit ran", errRerun)

// finishClaims runs the commit callbacks of the Finishes reqs not known
// to be lost, then ends their claims as Finished with one WorkFinishMany,
// which checks the session.
func (s *Session) finishClaims(ctx context.Context, tx *Tx, process string, reqs []*request, c *checks) error {
	var live []*request
	for _, r := range reqs {
		if !r.end.gone {
			live = append(live, r)
		}
	}
	if len(live) == 0 {
		return nil
	}
	c.last = false
	if err := commitEnds(tx, live); err != nil {
		return err
	}
	machines, claims := claimKeys(live)
	rows, err := tx.q.WorkFinishMany(ctx, store.WorkFinishManyParams{
		MachineIds: machines, ClaimIds: claims, Process: process, SessionID: s.id,
		ComponentName: s.conn.cfg.ComponentName, MaxIdleMs: s.maxIdleMs(),
	})
	if err != nil {
		return fmt.Errorf("bmdb: finishing %d claims of %q: %w", len(live), process, err)
	}
	if err := s.checked(c, len(rows) > 0 && rows[0].Alive); err != nil {
		return err
	}
	done := make([]uuid.NullUUID, len(rows))
	for i, row := range rows {
		done[i] = row.ClaimID
	}
	if markLost(live, done) {
		return errLostFinish
	}
	return nil
}

// stopClaims ends claims as Failed or Canceled, with their causes, in one
// WorkEndMany.
func (s *Session) stopClaims(ctx context.Context, tx *Tx, process string, event store.WorkHistoryEvent, reqs []*request) error {
	machines, claims := claimKeys(reqs)
	causes := make([]string, len(reqs))
	for i, r := range reqs {
		causes[i] = r.end.cause
	}
	ended, err := tx.q.WorkEndMany(ctx, store.WorkEndManyParams{
		Event: event, ComponentName: s.conn.cfg.ComponentName, Process: process, SessionID: s.id,
		MachineIds: machines, ClaimIds: claims, Causes: causes,
	})
	if err != nil {
		return fmt.Errorf("bmdb: ending %d claims of %q as %s: %w", len(reqs), process, event, err)
	}
	markLost(reqs, ended)
	return nil
}

// applyBackoffs puts the held failed claims with a Backoff in backoff, each
// grown from its machine's previous interval, in one statement.
func (s *Session) applyBackoffs(ctx context.Context, tx *Tx, process string, fails []*request, c *checks) error {
	var backed []*endRequest
	for _, r := range fails {
		if r.end.err == nil && r.end.backoff != nil {
			backed = append(backed, r.end)
		}
	}
	if len(backed) == 0 {
		return nil
	}
	c.last = false
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

// commitEnds runs the commit callbacks of the finished Works: each
// Finish's own, and each SharedCommit once with its Works. An error names
// the machine (or the number of machines) and the process.
func commitEnds(tx *Tx, finished []*request) error {
	var batches []*SharedCommit
	members := map[*SharedCommit][]*request{}
	for _, r := range finished {
		e := r.end
		switch {
		case e.batch != nil:
			if members[e.batch] == nil {
				batches = append(batches, e.batch)
			}
			members[e.batch] = append(members[e.batch], r)
		default:
			if err := callback([]*request{r}, func() error { return e.commit(tx) }); err != nil {
				return fmt.Errorf("bmdb: Finish(%q) of %s: commit: %w", e.w.process, e.w.machine, err)
			}
		}
	}
	for _, b := range batches {
		rs := members[b]
		works := make([]*Work, len(rs))
		for i, r := range rs {
			works[i] = r.end.w
		}
		if err := callback(rs, func() error { return b.commit(tx, works) }); err != nil {
			if len(works) == 1 {
				return fmt.Errorf("bmdb: Finish(%q) of %s: batch commit: %w", works[0].process, works[0].machine, err)
			}
			return fmt.Errorf("bmdb: Finish(%q) of %d machines: batch commit: %w", works[0].process, len(works), err)
		}
	}
	return nil
}

// claimKeys returns the machines and claim ids of the ends reqs.
func claimKeys(reqs []*request) (machines, claims []uuid.UUID) {
	machines, claims = make([]uuid.UUID, len(reqs)), make([]uuid.UUID, len(reqs))
	for i, r := range reqs {
		machines[i], claims[i] = r.end.w.machine, r.end.w.claimID
	}
	return machines, claims
}

// markLost gives ErrWorkLost to the ends whose claim is not among the
// claim ids an end statement returned, marks them gone for the batch's
// later attempts, and reports whether it found one. Claims, not machines:
// a session may end a stale Work and a newer claim of the same machine in
// one batch.
func markLost(reqs []*request, ended []uuid.NullUUID) bool {
	set := make(map[uuid.UUID]bool, len(ended))
	for _, c := range ended {
		if c.Valid {
			set[c.UUID] = true
		}
	}
	lost := false
	for _, r := range reqs {
		if !set[r.end.w.claimID] {
			r.end.err, r.end.gone, lost = r.end.w.lostError(), true, true
		}
	}
	return lost
}
