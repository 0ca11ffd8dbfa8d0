package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/wait"
)

// Work is a claim of one machine for one process by a session: the
// (machine, process) row of the work table, which no other session can hold
// at the same time.
//
// A Work must end with exactly one successful Finish, Cancel or Fail; after
// that, and after one of them has returned ErrWorkLost, ErrSessionExpired or
// ErrSessionClosed (the claim is gone either way), every one of them returns
// ErrWorkDone. A call that fails otherwise (ctx done, retries exhausted, an
// error from commit, ErrAmbiguousCommit) leaves the Work open, so the caller
// may retry it or end the Work another way: every end fences on the claim's
// identity, so a retry never ends a newer claim of the same machine. If the session ends first, its claims end
// with it (Close records them Canceled, expiry Abandoned).
//
// Work methods serialise themselves, but a Work is meant to be used by one
// goroutine.
type Work struct {
	s       *Session
	machine uuid.UUID
	process string
	claimID uuid.UUID // the claim's identity in the work table
	token   int64     // the claim's fencing token

	mu    sync.Mutex
	ended bool
}

// Machine returns the id of the claimed machine.
func (w *Work) Machine() uuid.UUID { return w.machine }

// Process returns the process the machine is claimed for.
func (w *Work) Process() string { return w.process }

// Session returns the session holding the claim.
func (w *Work) Session() *Session { return w.s }

// ClaimID returns the claim's identity: work.claim_id, and the claim_id of
// every history row of the claim, the Abandoned or Canceled rows that
// takeovers, GC and Session.Close write included.
func (w *Work) ClaimID() uuid.UUID { return w.claimID }

// FencingToken returns the claim's fencing token: a number that grows with
// every claim of the same (machine, process), whichever session takes it,
// and is recorded in the claim's Started history row. Pass it along with
// every effect of the work outside the database (a BMC, an installer's API,
// an object store) and have that system refuse a token lower than the
// highest it has seen: then a worker that lost its claim (it stalled, its
// session expired, another took the machine over) cannot overwrite what
// the newer claim did, even though it may still be running. See the
// package example of fencing.
func (w *Work) FencingToken() int64 { return w.token }

// Work claims a machine for process. In one transaction (see Transact) it
// runs retrieve, which returns candidate machine ids in order of preference,
// and claims the first candidate that is neither claimed for process nor in
// backoff for it, recording a Started history row. If there is none, a claim
// left by an expired session does not block: the same transaction deletes
// that session, recording each of its claims as Abandoned, and takes the
// first such candidate over. Deleting the session is what fences it: every
// transaction of a session holds its row, so one still open (a stalled or
// partitioned worker) either commits before the takeover or not at all.
//
// retrieve should read only; it may run several times (see Transact). It
// usually selects machines whose tags say they need the process and that
// have no work row for it, with a LIMIT; it need not exclude backoff, which
// Work enforces whatever retrieve returns.
//
// Work returns ErrNothingToDo when retrieve returns no candidate or only
// candidates in backoff, ErrWorkConflict when the remaining candidates are
// all claimed by live sessions (or by claims committing concurrently),
// ErrUnknownMachine for a candidate that is not in the machines table, an
// error wrapping ErrInvalidArgument for a bad process name or a nil
// retrieve, and the errors of Transact. If the claim's COMMIT was ambiguous,
// Work finds out which of its claims committed and returns those.
//
// Concurrent Work and WorkBatch calls of a session for the same process
// share one transaction, with the process's concurrent ends (see the
// package doc): each runs its own retrieve in it, after the ends, and gets
// machines no other call of the group got. A call whose ctx ends while it
// waits for its group leaves without claiming; once its group's
// transaction has begun it waits for the outcome, which is bounded by the
// session and by the latest deadline in the group.
// retrieve must not call Work or Finish of the same session (it would wait
// for its own group).
func (s *Session) Work(ctx context.Context, process string, retrieve func(tx *Tx) ([]uuid.UUID, error)) (*Work, error) {
	works, err := s.claimBatch(ctx, process, 1, retrieve)
	if err != nil {
		return nil, err
	}
	return works[0], nil
}

// claim is one claim taken by a claim transaction.
type claim struct {
	machine uuid.UUID
	id      uuid.UUID // work.claim_id: what Finish, Cancel and Fail fence on
	token   int64     // its fencing token
}

// claimBatch is Work and WorkBatch: it claims up to limit candidates, in a
// transaction that may serve the session's other concurrent claims of
// process too (claimgroup.go).
func (s *Session) claimBatch(ctx context.Context, process string, limit int, retrieve func(tx *Tx) ([]uuid.UUID, error)) ([]*Work, error) {
	if err := ValidateProcess(process); err != nil {
		return nil, err
	}
	if retrieve == nil {
		return nil, invalidArgument("Work: retrieve is nil")
	}
	start := time.Now()
	r := &claimRequest{limit: limit, retrieve: retrieve}
	err := s.claimGrouped(ctx, process, r)
	claims, abandoned := r.claims, r.abandoned
	metrics := s.conn.metrics
	if err != nil {
		if errors.Is(err, ErrWorkConflict) {
			metrics.conflict(process)
		}
		return nil, err
	}
	metrics.workEvents(abandoned, store.WorkHistoryEventAbandoned)
	works := make([]*Work, len(claims))
	for i, c := range claims {
		works[i] = &Work{s: s, machine: c.machine, process: process, claimID: c.id, token: c.token}
		metrics.workEvent(process, store.WorkHistoryEventStarted)
		metrics.claimed(process, time.Since(start).Seconds())
	}
	return works, nil
}

// resolveAmbiguousClaims finds out, after the connection failed during the
// claim's COMMIT (ambiguous), which of the claims that transaction made did
// commit (their claim ids are in the work table), so that no claim is left
// held by a live session with nobody working on it. It keeps trying while
// ctx and the session allow, and returns ambiguous if none committed.
func (s *Session) resolveAmbiguousClaims(ctx context.Context, process string, claims []claim, ambiguous error) ([]claim, error) {
	var held []claim
	for delay := txRetryBase; ; delay = min(2*delay, txRetryCap) {
		err := s.claimTransact(ctx, priorityEnd, func(tx *Tx) error {
			held = held[:0]
			for _, c := range claims {
				w, err := tx.q.WorkGet(ctx, store.WorkGetParams{MachineID: c.machine, Process: process})
				switch {
				case errors.Is(err, sql.ErrNoRows):
				case err != nil:
					return err
				case w.ClaimID == c.id:
					held = append(held, c)
				}
			}
			return nil
		})
		if err == nil {
			break
		}
		if ctx.Err() != nil || s.ctx.Err() != nil {
			// Close, or the session's expiry, removes whatever committed.
			return nil, fmt.Errorf("%w; then, finding out what it claimed: %w", ambiguous, err)
		}
		if wait.Sleep(ctx, delay) != nil {
			return nil, fmt.Errorf("%w; then, finding out what it claimed: %w", ambiguous, err)
		}
	}
	if len(held) == 0 {
		return nil, ambiguous
	}
	return held, nil
}

// claimMany runs WorkClaimMany on machines and returns the claims made, in
// the order of machines.
func (s *Session) claimMany(ctx context.Context, tx *Tx, process string, machines []uuid.UUID) ([]claim, error) {
	rows, err := tx.q.WorkClaimMany(ctx, store.WorkClaimManyParams{
		MachineIds: machines, Process: process, SessionID: s.id, ComponentName: s.conn.cfg.ComponentName,
	})
	if sqlState(err) == codeForeignKeyViolation {
		return nil, fmt.Errorf("%w: retrieve returned a machine that does not exist for %q: %w", ErrUnknownMachine, process, err)
	}
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

// takeOverFirst takes over the first candidate whose claim is held by an
// expired session, or says why no candidate can be claimed. It returns the
// processes of the claims it ended as Abandoned.
func (s *Session) takeOverFirst(ctx context.Context, tx *Tx, process string, candidates []uuid.UUID) (claim, []string, error) {
	conflict := false
	for _, machine := range candidates {
		state, err := tx.q.WorkClaimState(ctx, store.WorkClaimStateParams{MachineID: machine, Process: process})
		if err != nil {
			return claim{}, nil, fmt.Errorf("bmdb: Work(%q): reading claim of %s: %w", process, machine, err)
		}
		switch {
		case state.InBackoff:
			continue
		case state.ClaimedLive || !state.Claimed:
			conflict = true
			continue
		}
		abandoned, err := s.takeOver(ctx, tx, process, machine, state.Holder)
		if err != nil {
			return claim{}, nil, err
		}
		if abandoned == nil { // the holder came back to life, or went: try the next
			conflict = true
			continue
		}
		c, err := s.start(ctx, tx, machine, process)
		if err != nil {
			return claim{}, nil, err
		}
		return c, abandoned, nil
	}
	if conflict {
		return claim{}, nil, fmt.Errorf("%w (process %q)", ErrWorkConflict, process)
	}
	return claim{}, nil, fmt.Errorf("%w (process %q)", ErrNothingToDo, process)
}

// takeOver supersedes the expired session holding (machine, process): it
// locks the session row (waiting for that session's open transactions,
// which hold it), ends all its claims as Abandoned and deletes it. It
// returns the processes of the claims ended, or nil if holder is alive or
// gone by now.
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

// start inserts the claim, its Started history row and its fencing token.
func (s *Session) start(ctx context.Context, tx *Tx, machine uuid.UUID, process string) (claim, error) {
	row, err := tx.q.WorkStart(ctx, store.WorkStartParams{
		MachineID: machine, Process: process, SessionID: s.id, ComponentName: s.conn.cfg.ComponentName,
	})
	switch sqlState(err) {
	case "":
	case codeUniqueViolation:
		return claim{}, fmt.Errorf("%w (process %q, machine %s): %w", ErrWorkConflict, process, machine, err)
	case codeForeignKeyViolation:
		return claim{}, fmt.Errorf("%w: %s (process %q): %w", ErrUnknownMachine, machine, process, err)
	}
	if err != nil {
		return claim{}, fmt.Errorf("bmdb: Work(%q): claiming %s: %w", process, machine, err)
	}
	return claim{machine: machine, id: row.ClaimID.UUID, token: row.FencingToken.Int64}, nil
}

// Finish ends the Work successfully: in one transaction it deletes the
// claim (only if this session still holds it), records Finished, clears any
// backoff of (machine, process), and runs commit, which applies the result of
// the work, e.g. sets the application's tag for the machine. If the claim is
// gone (taken over after expiry, or removed with the session) Finish returns
// ErrWorkLost, or ErrSessionExpired, and commit does not take effect.
//
// Concurrent Finish, FinishWith, Cancel and Fail calls of a session for
// one process share one transaction, with the process's concurrent claims
// (multi-row statements, each commit callback in turn, before the claims'
// retrievals); each returns its own outcome, and nil only once that
// transaction committed. A call waits for its group once the group's
// transaction has started, even if ctx ends.
//
// commit may run several times (see Transact) and must not be nil; it must
// not call Work, Finish, Cancel or Fail of the same session (it would wait
// for its own group). An error from commit fails only its own Finish and
// leaves the Work open: the group's calls (ends and claims) are then
// retried one at a time, each in a transaction of its own.
func (w *Work) Finish(ctx context.Context, commit func(tx *Tx) error) error {
	if commit == nil {
		return invalidArgument("Finish: commit is nil")
	}
	return w.end(ctx, &endRequest{w: w, event: store.WorkHistoryEventFinished, commit: commit})
}

// FinishWith is Finish with the result committed by g, once for all the
// Works of its transaction that pass g (see CommitGroup). It returns an
// error wrapping ErrInvalidArgument if g or g.Commit is nil.
func (w *Work) FinishWith(ctx context.Context, g *CommitGroup) error {
	if g == nil || g.Commit == nil {
		return invalidArgument("FinishWith: the CommitGroup or its Commit is nil")
	}
	return w.end(ctx, &endRequest{w: w, event: store.WorkHistoryEventFinished, group: g})
}

// Cancel ends the Work without a result and without backoff: it deletes the
// claim (only if this session still holds it) and records Canceled, so that
// the machine can be claimed again at once. Use it when the work was
// interrupted, e.g. on shutdown. It returns ErrWorkLost or ErrSessionExpired
// if the claim was already gone. Like Finish, it may share its transaction.
func (w *Work) Cancel(ctx context.Context) error {
	return w.end(ctx, &endRequest{w: w, event: store.WorkHistoryEventCanceled})
}

// Fail ends the Work unsuccessfully: it deletes the claim (only if this
// session still holds it), records Failed with cause, and, if backoff is not
// nil, keeps (machine, process) from being claimed again for an interval
// grown from the previous one (see Backoff). cause is truncated to
// MaxCauseLength bytes. It returns an error wrapping ErrInvalidArgument for
// an invalid backoff, and ErrWorkLost or ErrSessionExpired if the claim was
// already gone. Like Finish, it may share its transaction.
func (w *Work) Fail(ctx context.Context, backoff *Backoff, cause string) error {
	if backoff != nil {
		if err := backoff.Validate(); err != nil {
			return err
		}
	}
	return w.end(ctx, &endRequest{w: w, event: store.WorkHistoryEventFailed, cause: truncateCause(cause), backoff: backoff})
}

// end runs one of Finish, Cancel and Fail, at most once successfully.
func (w *Work) end(ctx context.Context, r *endRequest) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return fmt.Errorf("bmdb: ending %q on %s as %s: %w", w.process, w.machine, r.event, ErrWorkDone)
	}
	if err := w.s.alive(); err != nil {
		w.ended = claimGone(err)
		return err
	}
	err := w.s.endGrouped(ctx, r)
	if err == nil || claimGone(err) {
		w.ended = true
	}
	return err
}

// claimGone reports whether err says the claim no longer exists.
func claimGone(err error) bool {
	return errors.Is(err, ErrWorkLost) || errors.Is(err, ErrSessionExpired) || errors.Is(err, ErrSessionClosed)
}

// lostError is ErrWorkLost for w.
func (w *Work) lostError() error {
	return fmt.Errorf("%w: %q on %s is no longer held by session %s", ErrWorkLost, w.process, w.machine, w.s.id)
}
