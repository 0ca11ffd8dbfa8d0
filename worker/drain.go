package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/model"
)

// A loop with Config.StopWhenIdle stops when it has had nothing it can do
// for that long. Nothing it can do is not nothing left: machines in
// backoff, and machines claimed by other sessions (at work, or dead and
// not yet expired), are work of the process that is not done. So an idle
// loop counts them on the database (model's CurrentWorkLeftForProcess)
// before it stops, waits for them for up to Config.DrainTimeout, and says
// what was left in Run's error: a nil error means nothing was. A loop of
// a group (RunAll) does all this too, but stops only with its group (see
// group.go).

// ErrWorkLeft is wrapped by the *LeftError that Run returns when a loop
// with Config.StopWhenIdle stopped with work of its process left.
var ErrWorkLeft = errors.New("worker: stopped when idle with work left")

// LeftError is Run's error when a loop with Config.StopWhenIdle stopped
// while work of its process was left that it could not do (it had been
// idle for StopWhenIdle, then waited DrainTimeout without finishing a
// machine): the counts are the database's when it stopped.
// errors.Is(err, ErrWorkLeft) reports it.
type LeftError struct {
	// Process is the loop's process (Config.Process).
	Process string
	// Idle is how long the loop had had nothing it could do when it
	// stopped.
	Idle time.Duration
	// InBackoff counts the machines in backoff for Process: their last
	// claim failed, and bmdb refuses to claim them until the backoff
	// ends (or an operator clears it: bmdbctl backoff clear).
	InBackoff int64
	// ClaimedByOthers counts the claims of Process held by other
	// sessions: alive ones, still at work or dead and not yet expired
	// (the first claim after their deadline takes them over), and
	// expired ones that no claim has taken over yet.
	ClaimedByOthers int64
}

func (e *LeftError) Error() string {
	return fmt.Sprintf("worker %s: stopped after %v idle with work left: %d machines in backoff, %d claimed by other sessions",
		e.Process, e.Idle.Round(time.Millisecond), e.InBackoff, e.ClaimedByOthers)
}

// Unwrap returns ErrWorkLeft.
func (e *LeftError) Unwrap() error { return ErrWorkLeft }

// errIdle is the cause of Run's end when it stopped idle with nothing
// left: Run returns nil.
var errIdle = errors.New("worker: idle, nothing left")

// drain is a claimer's wait for work left (DrainTimeout).
type drain struct {
	since    time.Time // since when it waits (zero: not waiting)
	finished int64     // the loop's finished claims then
	// emptyAt is the loop's claims (polls and successes) when a count
	// found nothing left; zero when the last count found work left. A
	// backoff that ends after a claim found nothing and before the count
	// is not counted, but the next claim finds it: so the loop stops only
	// once a claim after an empty count found nothing too.
	emptyAt struct{ polls, claimed int64 }
	// epoch is the group's epoch when the last count was made (see
	// group.go; 0 for a loop run alone). A count of an older epoch is
	// made again before the loop says it is ready.
	epoch int64
	// ready: in a group, the loop said it is ready and the group did not
	// stop: it polls on as usual until the group stops or wakes it.
	ready bool
}

// untilStop is how long from now the claimer idle since then stops at the
// latest, if nothing changes: at StopWhenIdle, then at the end of dr, or
// at once to confirm an empty count; in a group, once ready, not before
// its next poll.
func (l *Loop) untilStop(since time.Time, dr *drain) time.Duration {
	switch idle := time.Since(since); {
	case idle < l.cfg.StopWhenIdle || dr.since.IsZero():
		return l.cfg.StopWhenIdle - idle
	case dr.ready:
		return l.cfg.PollMax
	case dr.emptyAt.polls != 0:
		return 0
	}
	return l.cfg.DrainTimeout - time.Since(dr.since)
}

// drained is called by the claimer once it has been idle for StopWhenIdle
// (idle so far), after a claim that returned claimErr. It stops Run (see
// done) and reports true if nothing is left (a count found nothing, and a
// claim after it found nothing to do), or if dr is over; otherwise it
// reports false and the claimer polls on.
func (l *Loop) drained(ctx context.Context, sess *bmdb.Session, idle time.Duration, dr *drain, claimErr error) bool {
	polls, claimed := l.polls.Load(), l.claimed.Load()
	if dr.epoch != l.member.epoch() {
		dr.emptyAt.polls, dr.emptyAt.claimed = 0, 0 // a group's final round: count again
	}
	if e := dr.emptyAt; e.polls != 0 && polls > e.polls && claimed == e.claimed && errors.Is(claimErr, bmdb.ErrNothingToDo) {
		return l.done(errIdle, idle, dr)
	}
	dr.emptyAt.polls, dr.emptyAt.claimed = 0, 0
	if finished := l.finished.Load(); dr.since.IsZero() || finished != dr.finished {
		dr.since, dr.finished = time.Now(), finished // the wait starts, or starts anew after progress
	}
	dr.epoch = l.member.epoch()
	left, err := model.New(l.conn.DB()).CurrentWorkLeftForProcess(ctx, model.CurrentWorkLeftForProcessParams{
		Process: l.cfg.Process, SessionID: sess.ID(),
	})
	if err == nil {
		l.countWarn.ok()
	}
	over := time.Since(dr.since) >= l.cfg.DrainTimeout
	switch {
	case err != nil && ctx.Err() != nil:
		return true // shutting down
	case err != nil && over:
		l.stop(fmt.Errorf("worker %s: idle for %v, but counting the work left failed: %w", l.cfg.Process, idle.Round(time.Millisecond), err))
		return true
	case err != nil:
		l.countWarn.warn(fmt.Sprintf("worker %s: idle; counting the work left: %v", l.cfg.Process, err))
	case left.InBackoff == 0 && left.ClaimedByOthers == 0:
		dr.emptyAt.polls, dr.emptyAt.claimed = polls, claimed // to confirm with one more claim
	case over:
		return l.done(&LeftError{Process: l.cfg.Process, Idle: idle, InBackoff: left.InBackoff, ClaimedByOthers: left.ClaimedByOthers}, idle, dr)
	}
	dr.ready = false
	l.member.idle()
	return false
}

// done is called by the claimer when the loop is done (idle for
// StopWhenIdle, and nothing left or DrainTimeout over), with cause
// errIdle or a *LeftError. A loop run alone stops Run with cause and
// done reports true. A loop of a group tells the group, which stops every
// loop once all are done (see group.go), and done reports whether it did.
func (l *Loop) done(cause error, idle time.Duration, dr *drain) bool {
	if l.member == nil {
		if cause == errIdle {
			klog.V(1).Infof("worker %s: nothing left after %v idle; stopping", l.cfg.Process, idle.Round(time.Millisecond))
		}
		l.stop(cause)
		return true
	}
	if l.member.ready(cause, dr.epoch) {
		return true
	}
	dr.ready = true
	return false
}
