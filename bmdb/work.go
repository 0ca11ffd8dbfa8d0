package bmdb

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/bmdb-dev/bmdb/internal/claims"
	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/txn"
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
	process string
	claim   claims.Claim      // the machine, the claim's identity in the work table, its fencing token
	batch   trace.SpanContext // the span of the batch that claimed it (invalid: not traced)

	mu    sync.Mutex
	ended bool
}

// Machine returns the id of the claimed machine.
func (w *Work) Machine() uuid.UUID { return w.claim.Machine }

// Process returns the process the machine is claimed for.
func (w *Work) Process() string { return w.process }

// Session returns the session holding the claim.
func (w *Work) Session() *Session { return w.s }

// ClaimID returns the claim's identity: work.claim_id, and the claim_id of
// every history row of the claim, the Abandoned or Canceled rows that
// takeovers, GC and Session.Close write included.
func (w *Work) ClaimID() uuid.UUID { return w.claim.ID }

// FencingToken returns the claim's fencing token: a number that grows with
// every claim of the same (machine, process), whichever session takes it,
// and is recorded in the claim's Started history row. Pass it along with
// every effect of the work outside the database (a BMC, an installer's API,
// an object store) and have that system refuse a token lower than the
// highest it has seen: then a worker that lost its claim (it stalled, its
// session expired, another took the machine over) cannot overwrite what
// the newer claim did, even though it may still be running. See the
// package example of fencing.
func (w *Work) FencingToken() int64 { return w.claim.Token }

// Work claims a machine for process: WorkMany with a limit of one. In one
// transaction it runs retrieve, which returns candidate machine ids in
// order of preference, and claims the first candidate that is neither
// claimed for process nor in backoff for it, recording a Started history
// row. If there is none, a claim left by an expired session does not
// block: the same transaction deletes that session, recording each of its
// claims as Abandoned, and takes the first such candidate over (see
// Mechanism in the package doc for why the expired holder then commits
// nothing).
//
// retrieve should read only; it may run several times (see Transact). It
// usually selects machines whose tags say they need the process and that
// have no work row for it, with a LIMIT; it need not exclude backoff, which
// Work enforces whatever retrieve returns. It runs on the session's
// batcher goroutine for process (see "Batches" in the package doc), so it
// must not call Work or the ends of the same session and process; if it
// panics, Work panics with the same value.
//
// Work returns ErrNothingToDo when retrieve returns no candidate or only
// candidates in backoff, ErrWorkConflict when the remaining candidates are
// all claimed by live sessions (or by claims committing concurrently),
// ErrUnknownMachine when none could be claimed and a candidate is not in
// the machines table (a candidate that is not a machine is never claimed), an
// error wrapping ErrInvalidArgument for a bad process name or a nil
// retrieve, ctx's cause if ctx ends before its batch begins, and the errors
// of Transact. If the claim's COMMIT was ambiguous, Work finds out which of
// its claims committed and returns those.
func (s *Session) Work(ctx context.Context, process string, retrieve func(tx *Tx) ([]uuid.UUID, error)) (*Work, error) {
	works, err := s.workMany(ctx, "bmdb.Work", process, 1, retrieve)
	if err != nil {
		return nil, err
	}
	return works[0], nil
}

// MaxWorkMany is the largest limit of WorkMany.
const MaxWorkMany = 1000

// WorkMany is Work for up to limit machines at once: it claims as many
// of retrieve's candidates as it can, in order, up to limit, and returns
// one Work for each, to be ended on its own. A batch holds its machines
// until each ends, so keep limit near what a worker processes at once
// (worker.Loop claims for its free handlers). It returns an error wrapping
// ErrInvalidArgument for limit outside [1, MaxWorkMany], and otherwise the
// errors of Work.
func (s *Session) WorkMany(ctx context.Context, process string, limit int, retrieve func(tx *Tx) ([]uuid.UUID, error)) ([]*Work, error) {
	return s.workMany(ctx, "bmdb.WorkMany", process, limit, retrieve)
}

// workMany is WorkMany, traced as a span named name.
func (s *Session) workMany(ctx context.Context, name, process string, limit int, retrieve func(tx *Tx) ([]uuid.UUID, error)) (_ []*Work, err error) {
	ctx, span := s.conn.tracer.Start(ctx, name)
	var c *claims.ClaimCall
	defer func() { endWorkMany(span, process, limit, c, err) }()
	if limit < 1 || limit > MaxWorkMany {
		return nil, invalidArgument("WorkMany: limit is %d, must be in [1, %d]", limit, MaxWorkMany)
	}
	if err := ValidateProcess(process); err != nil {
		return nil, err
	}
	if retrieve == nil {
		return nil, invalidArgument("Work: retrieve is nil")
	}
	c = &claims.ClaimCall{Limit: limit, Retrieve: func(tx *txn.Tx) ([]uuid.UUID, error) { return retrieve(newTx(tx)) }}
	err = s.claims.Do(ctx, process, c, nil)
	if err == nil {
		err = c.Err
	}
	if err != nil {
		return nil, err
	}
	works := make([]*Work, len(c.Claims))
	for i, got := range c.Claims {
		works[i] = &Work{s: s, process: process, claim: got, batch: c.Batch.Span}
	}
	return works, nil
}

// Finish ends the Work successfully: in one transaction it deletes the
// claim (only if this session still holds it), records Finished, clears any
// backoff of (machine, process), and runs commit, which applies the result
// of the work, e.g. sets the application's tag for the machine. If the claim
// is gone (taken over after expiry, or removed with the session) Finish
// returns ErrWorkLost, or ErrSessionExpired, and commit does not take
// effect (it runs before the claim's statement, which is the check before
// COMMIT: if that finds the claim gone, the attempt is rolled back and
// runs again without it). Finish, Cancel and Fail share their transaction with the
// session's other claims and ends of the process (see "Batches" in the
// package doc): each returns its own outcome, and nil only once that
// transaction committed.
//
// commit may run several times (see Transact), on the session's batcher
// goroutine: it must not call Work, Finish, Cancel or Fail of the same
// session and process; if it panics, Finish panics with the same value and
// the Work stays open. An error from commit, wrapped with the machine and
// the process, fails only this Finish and leaves the Work open. commit must
// not be nil, unless opts hold CommitShared, which commits the result with
// a SharedCommit instead (commit must then be nil).
func (w *Work) Finish(ctx context.Context, commit func(tx *Tx) error, opts ...FinishOption) error {
	e, err := finishCall(commit, opts)
	if err != nil {
		return err
	}
	return w.end(ctx, e)
}

// finishCall is the end call of a Finish with commit and opts, or why they
// are invalid.
func finishCall(commit func(tx *Tx) error, opts []FinishOption) (*claims.EndCall, error) {
	e := &claims.EndCall{Event: store.WorkHistoryEventFinished}
	var shared *SharedCommit
	switch {
	case len(opts) > 1:
		return nil, invalidArgument("Finish: %d options; it takes one CommitShared at most", len(opts))
	case len(opts) == 1 && opts[0].shared == nil:
		return nil, invalidArgument("Finish: CommitShared of a nil SharedCommit (make one with NewSharedCommit)")
	case len(opts) == 1:
		shared = opts[0].shared
	}
	switch {
	case shared == nil && commit == nil:
		return nil, invalidArgument("Finish: commit is nil")
	case shared != nil && commit != nil:
		return nil, invalidArgument("Finish: both a commit and CommitShared")
	case shared != nil:
		e.Shared = shared.shared
	default:
		e.Commit = func(tx *txn.Tx) error { return commit(newTx(tx)) }
	}
	return e, nil
}

// FinishAndWork is Finish followed, in the same transaction, by Work for
// the same process: it ends the Work successfully, committing commit's
// result (or, with CommitShared, a SharedCommit's), and claims the next
// machine among what retrieve returns, as Work does. A component that
// processes machines one after another pays one transaction per machine
// instead of two (worker.Loop does so for each handler). Used by hand,
// Finish and Work keep their meaning; this is the one way to do both at
// once.
//
// err is the Finish's outcome, as Finish returns it: nil only once the end
// committed; an error leaves the Work as a failed Finish does, and claims
// nothing. When err is nil, next is the Work claimed, or nil with claimErr
// saying why none was (ErrNothingToDo, ErrProcessPaused, ErrCapReached,
// ErrWorkConflict, ErrUnknownMachine, retrieve's error): the claim never
// undoes the end. The claim part runs after the retrievals of the
// transaction's claims and before its ends (see "Batches" in the package
// doc), so retrieve sees the state before this Finish's commit: it must not
// return the machine being finished as needing the process again. The
// contracts of commit and retrieve are Finish's and Work's.
func (w *Work) FinishAndWork(ctx context.Context, commit func(tx *Tx) error, retrieve func(tx *Tx) ([]uuid.UUID, error), opts ...FinishOption) (next *Work, claimErr, err error) {
	if retrieve == nil {
		return nil, nil, invalidArgument("FinishAndWork: retrieve is nil")
	}
	e, err := finishCall(commit, opts)
	if err != nil {
		return nil, nil, err
	}
	c := &claims.ClaimCall{Limit: 1, Retrieve: func(tx *txn.Tx) ([]uuid.UUID, error) { return retrieve(newTx(tx)) }}
	if err := w.endWith(ctx, e, c); err != nil {
		return nil, nil, err
	}
	if c.Err != nil {
		return nil, c.Err, nil
	}
	if len(c.Claims) == 0 {
		return nil, fmt.Errorf("%w (process %q)", ErrNothingToDo, w.process), nil
	}
	return &Work{s: w.s, process: w.process, claim: c.Claims[0], batch: c.Batch.Span}, nil, nil
}

// Cancel ends the Work without a result and without backoff: it deletes the
// claim (only if this session still holds it) and records Canceled, so that
// the machine can be claimed again at once. Use it when the work was
// interrupted, e.g. on shutdown. It returns ErrWorkLost or ErrSessionExpired
// if the claim was already gone. Like Finish, it shares its transaction.
func (w *Work) Cancel(ctx context.Context) error {
	return w.end(ctx, &claims.EndCall{Event: store.WorkHistoryEventCanceled})
}

// Fail ends the Work unsuccessfully: it deletes the claim (only if this
// session still holds it), records Failed with cause, and, if backoff is not
// nil, keeps (machine, process) from being claimed again for an interval
// grown from the previous one (see Backoff). cause is truncated to
// 4096 bytes. It returns an error wrapping ErrInvalidArgument for
// an invalid backoff, and ErrWorkLost or ErrSessionExpired if the claim was
// already gone. Like Finish, it shares its transaction.
func (w *Work) Fail(ctx context.Context, backoff *Backoff, cause string) error {
	if backoff != nil {
		if err := backoff.Validate(); err != nil {
			return err
		}
	}
	e := &claims.EndCall{Event: store.WorkHistoryEventFailed, Cause: truncateCause(cause)}
	if backoff != nil {
		e.Backoff = backoffPolicy{*backoff}
	}
	return w.end(ctx, e)
}

// end runs one of Finish, Cancel and Fail, at most once successfully.
func (w *Work) end(ctx context.Context, e *claims.EndCall) error { return w.endWith(ctx, e, nil) }

// endWith is end, with a claim c of the next machine in the same call (nil:
// none).
func (w *Work) endWith(ctx context.Context, e *claims.EndCall, c *claims.ClaimCall) (err error) {
	ctx, span := w.s.conn.tracer.Start(ctx, endSpanName(e, c))
	defer func() { w.endEnd(span, e, c, err) }()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return fmt.Errorf("bmdb: ending %q on %s as %s: %w", w.process, w.claim.Machine, e.Event, ErrWorkDone)
	}
	e.Claim, e.Owner = w.claim, w
	err = w.s.claims.Do(ctx, w.process, c, e)
	if err == nil {
		err = e.Err
	}
	if err == nil || claimGone(err) {
		w.ended = true
	}
	return err
}

// claimGone reports whether err says the claim no longer exists.
func claimGone(err error) bool {
	return errors.Is(err, ErrWorkLost) || errors.Is(err, ErrSessionExpired) || errors.Is(err, ErrSessionClosed)
}
