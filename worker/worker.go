// Package worker runs the claim loop every bmdb component needs: it claims
// machines for one process, processes each in a handler goroutine of its
// own, up to Config.Concurrency at once, and ends each claim with Finish
// (success), Fail with backoff (error) or Cancel (shutdown), recreating the
// session when it expires.
//
// A Loop owns one session at a time. Its claimer claims for all its free
// handlers in one Session.WorkMany, and its handlers end their claims
// with Finish, Fail and Cancel, which bmdb batches (see "Batches" in
// package bmdb's doc).
//
// Processing runs under a context that is cancelled when that session ends,
// so a worker that lost its claims stops working on them; it is not
// cancelled when Run's context is, so in-flight work may finish within
// Config.ShutdownGrace.
//
// A process that runs several loops, such as the stages of a pipeline
// whose later stages work on what earlier ones finished, runs them with
// RunAll: with Config.StopWhenIdle they stop together, once all of them
// are idle at once, not each when it alone is.
//
// With the Connection's bmdb.Config.TracerProvider set, a Loop traces
// each claim call as a worker.claim span and each machine's handling as a
// worker.handle span (bmdb.process, bmdb.machine, bmdb.claim_id,
// bmdb.fencing_token, bmdb.outcome: finished, failed, canceled, lost),
// both children of the span of Run's context. The Handler's context
// carries the worker.handle span, which links to the span of the batch
// transaction that claimed the machine, and the claim's end is its child.
package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/internal/claims"
	"github.com/bmdb-dev/bmdb/internal/tracing"
	"github.com/bmdb-dev/bmdb/internal/wait"
)

// Defaults of Config.
const (
	ConcurrencyDefault   = 1
	CandidatesDefault    = 64
	PollMinDefault       = 100 * time.Millisecond
	PollMaxDefault       = 5 * time.Second
	ShutdownGraceDefault = 10 * time.Second
	RestartDelayDefault  = time.Second
)

// BackoffDefault is the default Config.Backoff: 1s doubling up to 5 minutes,
// with 20% jitter.
var BackoffDefault = bmdb.Backoff{Initial: time.Second, Maximum: 5 * time.Minute, Exponent: 2, Jitter: 0.2}

// Retrieve returns candidate machines for the process, at most limit of
// them, in order of preference. It runs inside Work's transaction and may
// run several times: it must only read, through tx. Every id it returns
// must be a machine's (machines.machine_id): an id that is not is a bug of
// the retrieval, which ends Run with an error wrapping ErrPermanent and
// bmdb.ErrUnknownMachine, naming the id.
type Retrieve func(ctx context.Context, tx *bmdb.Tx, limit int32) ([]uuid.UUID, error)

// Handler does the work on a claimed machine outside any transaction, and
// returns what Finish commits, or an error, which fails the Work with
// Config.Backoff and the error's text as cause.
//
// A nil commit with a nil error is the one place bmdb accepts "no commit":
// it means the machine's work left nothing to write beyond ending the
// claim (or, if Config.CommitShared is set, that CommitShared writes it), and
// the loop finishes the claim. bmdb's Work.Finish itself refuses a nil
// commit (ErrInvalidArgument): code that calls Finish directly passes
// func(*bmdb.Tx) error { return nil } to say the same.
//
// An error returned by commit fails the claim with backoff (its cause
// names the machine and the process); one that no retry can fix
// (bmdb.IsPermanent: a missing table or column, a syntax error, a
// permission denied, a type mismatch) also ends Run with ErrPermanent. ctx
// is cancelled when the session ends (the claim can no longer be finished)
// or ShutdownGrace after shutdown began; the Handler should then return
// promptly. Each call runs on a handler goroutine of its own, up to
// Config.Concurrency at once.
type Handler func(ctx context.Context, w *bmdb.Work) (commit func(tx *bmdb.Tx) error, err error)

// Config configures a Loop. Process, Retrieve and Work are required.
type Config struct {
	// Process is the bmdb process name the loop claims machines for.
	// Required.
	Process string
	// Retrieve proposes machines to claim. Required.
	Retrieve Retrieve
	// Work processes one claimed machine. Required.
	Work Handler
	// CommitShared, if set, commits the results of the machines whose Work
	// returned a nil commit and no error, once for all such machines that
	// one of bmdb's batches finishes (bmdb.CommitShared): one statement for
	// many machines instead of a callback each, for applications whose
	// results can be written that way. It has the contract of
	// bmdb.NewSharedCommit's commit. Defaults to nil: such machines are
	// finished with nothing committed beyond ending their claims.
	CommitShared func(tx *bmdb.Tx, works []*bmdb.Work) error
	// Concurrency is how many machines the loop works on at once, each in
	// a handler goroutine of its own; the loop claims for all its free
	// handlers in one transaction. A handler's slot is free again when its
	// Work returns, while its claim is being ended (the next claim may share
	// that end's transaction), so the loop holds up to 2*Concurrency
	// claims. At most bmdb.MaxWorkMany. Defaults to ConcurrencyDefault.
	Concurrency int
	// Candidates is the limit passed to Retrieve (widened after conflicts,
	// see PollMin). The loop tries the candidates in random order, so that
	// loops of other processes spread over them: the more candidates, the
	// fewer of them two loops' claims both try (on PostgreSQL a candidate
	// another process claimed after this claim's snapshot makes the claim
	// statement try again). Defaults to CandidatesDefault, or
	// 2*Concurrency if that is more.
	Candidates int
	// Backoff is applied to a machine whose Work failed. Defaults to
	// BackoffDefault.
	Backoff bmdb.Backoff
	// PollMin and PollMax bound the wait of a claimer that found nothing to
	// do, or its process paused or at its cap (it logs a pause once, and
	// the resume once): it starts at PollMin, doubles up to PollMax while nothing is
	// found, and each wait is jittered down by up to half, so idle claimers
	// neither spin nor wake in step. A claimer whose candidates were all
	// taken by other sessions (bmdb.ErrWorkConflict: work exists) does not
	// wait: it asks at once for twice as many candidates, up to
	// conflictWiden times, and waits as for nothing to do only after that.
	// Defaults to PollMinDefault and PollMaxDefault.
	PollMin, PollMax time.Duration
	// ShutdownGrace is how long in-flight work may run on after Run's
	// context is done before its context is cancelled and its claim
	// Canceled. Defaults to ShutdownGraceDefault.
	ShutdownGrace time.Duration
	// RestartDelay is the wait before starting a new session after one
	// ended or could not be started. Defaults to RestartDelayDefault.
	RestartDelay time.Duration
	// StopWhenIdle, if positive, makes Run return once the loop has had
	// nothing it can do for this long (it is idle): no handler running,
	// and every claim in that time finding no candidate
	// (bmdb.ErrNothingToDo, which includes candidates in backoff) or only
	// candidates claimed by other sessions (bmdb.ErrWorkConflict); a
	// pause or a cap of the process keeps it from being idle (work is
	// left: bmdb.ErrProcessPaused, bmdb.ErrCapReached). For batch jobs and
	// tests that process what there is and exit. Run then
	// counts the work of the process it could not do: machines in backoff
	// and claims held by other sessions (still at work, or dead and not
	// yet expired). If there is none it returns nil; otherwise it waits
	// for up to DrainTimeout more, and returns a *LeftError saying how
	// much was left if the work has not been done by then. A loop run by
	// RunAll does not stop by itself: its group stops when every loop
	// would, at the same time. Defaults to 0: Run returns only when its
	// context is done (or on a permanent error).
	StopWhenIdle time.Duration
	// DrainTimeout is how long a loop that is idle for StopWhenIdle with
	// work of its process left keeps polling for that work to become
	// doable: backoffs that end, claims that other sessions end, claims
	// of dead sessions that expire (the loop then takes them over). Run
	// returns nil as soon as the loop is idle with nothing left, and a
	// *LeftError once it has waited DrainTimeout without finishing a
	// machine: each machine the loop finishes starts the wait anew, a
	// failed retry does not, so that a machine that keeps failing cannot
	// keep the loop running. Used only with StopWhenIdle. Defaults to 0:
	// Run returns at StopWhenIdle, with a *LeftError if work is left.
	DrainTimeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.Concurrency == 0 {
		c.Concurrency = ConcurrencyDefault
	}
	if c.Candidates == 0 {
		c.Candidates = max(CandidatesDefault, 2*c.Concurrency)
	}
	if c.Backoff == (bmdb.Backoff{}) {
		c.Backoff = BackoffDefault
	}
	if c.PollMin == 0 {
		c.PollMin = PollMinDefault
	}
	if c.PollMax == 0 {
		c.PollMax = max(PollMaxDefault, c.PollMin)
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = ShutdownGraceDefault
	}
	if c.RestartDelay == 0 {
		c.RestartDelay = RestartDelayDefault
	}
	return c
}

// Validate reports, as New would, whether c is unusable: it returns an
// error wrapping bmdb.ErrInvalidArgument that names the first bad field
// (after defaults), or nil. It touches no database: call it before
// bmdb.Open, so that a bad Config, such as a process name with a space,
// is refused before Open migrates anything.
func (c Config) Validate() error { return c.withDefaults().validate() }

func (c Config) validate() error {
	if err := bmdb.ValidateProcess(c.Process); err != nil {
		return fmt.Errorf("worker.Config.Process: %w", err)
	}
	switch {
	case c.Retrieve == nil:
		return fmt.Errorf("%w: worker.Config.Retrieve is nil", bmdb.ErrInvalidArgument)
	case c.Work == nil:
		return fmt.Errorf("%w: worker.Config.Work is nil", bmdb.ErrInvalidArgument)
	case c.Concurrency < 1 || c.Concurrency > bmdb.MaxWorkMany:
		return fmt.Errorf("%w: worker.Config.Concurrency is %d, must be in [1, %d]", bmdb.ErrInvalidArgument, c.Concurrency, bmdb.MaxWorkMany)
	case c.Candidates < 1 || c.Candidates > 1<<20:
		return fmt.Errorf("%w: worker.Config.Candidates is %d, must be in [1, 2^20]", bmdb.ErrInvalidArgument, c.Candidates)
	case c.PollMin <= 0 || c.PollMax < c.PollMin:
		return fmt.Errorf("%w: worker.Config.PollMin/PollMax are %v/%v, need 0 < PollMin <= PollMax", bmdb.ErrInvalidArgument, c.PollMin, c.PollMax)
	case c.ShutdownGrace < 0:
		return fmt.Errorf("%w: worker.Config.ShutdownGrace is %v, must not be negative", bmdb.ErrInvalidArgument, c.ShutdownGrace)
	case c.RestartDelay < 0:
		return fmt.Errorf("%w: worker.Config.RestartDelay is %v, must not be negative", bmdb.ErrInvalidArgument, c.RestartDelay)
	case c.StopWhenIdle < 0:
		return fmt.Errorf("%w: worker.Config.StopWhenIdle is %v, must not be negative", bmdb.ErrInvalidArgument, c.StopWhenIdle)
	case c.DrainTimeout < 0:
		return fmt.Errorf("%w: worker.Config.DrainTimeout is %v, must not be negative", bmdb.ErrInvalidArgument, c.DrainTimeout)
	case c.DrainTimeout > 0 && c.StopWhenIdle == 0:
		return fmt.Errorf("%w: worker.Config.DrainTimeout is %v without StopWhenIdle: the loop drains only when it stops when idle", bmdb.ErrInvalidArgument, c.DrainTimeout)
	}
	if err := c.Backoff.Validate(); err != nil {
		return fmt.Errorf("worker.Config.Backoff: %w", err)
	}
	return nil
}

// Stats are a Loop's cumulative figures.
type Stats struct {
	Sessions  int64 // sessions started
	Polls     int64 // claim calls (Session.WorkMany)
	Asked     int64 // machines asked for by those calls (free handlers)
	Claimed   int64 // successful claims
	Finished  int64 // claims ended by Finish
	Failed    int64 // claims ended by Fail
	Canceled  int64 // claims ended by Cancel (shutdown)
	Lost      int64 // claims lost with their session, or fenced off
	Conflicts int64 // claim calls that returned ErrWorkConflict (candidates taken)

	NothingToDo int64         // claim calls that returned ErrNothingToDo (not paused or capped)
	Paused      int64         // claim calls that found the process paused (bmdb.ErrProcessPaused)
	Capped      int64         // claim calls that found it at its cap (bmdb.ErrCapReached)
	PollSleeps  int64         // waits between claim calls (nothing to do, conflicts after widening, errors)
	PollSleep   time.Duration // time spent in those waits
}

// Loop runs claimers for one process. Create it with New and run it once
// with Run. Stats is safe to call concurrently with Run.
type Loop struct {
	conn   *bmdb.Connection
	cfg    Config
	batch  *bmdb.SharedCommit // of Config.CommitShared; nil without one
	tracer tracing.Tracer     // the Connection's TracerProvider's; off without one
	// stop ends Run early with a cause: errIdle, a *LeftError, or an
	// error wrapping ErrPermanent. Set by Run before it starts any
	// goroutine; called by the claimer and the handlers.
	stop context.CancelCauseFunc

	stopOnce sync.Once // guards the first permanent error
	started  atomic.Bool
	// ended wakes a claimer that found the process at its cap: one of
	// the loop's claims is ending (its handler is done: a claim made now
	// shares the end's transaction, which frees the slot first), or has
	// ended. Capacity 1; handlers send without waiting (wakeClaimer), the
	// claimer receives.
	ended                                             chan struct{}
	sessions, polls, asked, claimed, finished, failed atomic.Int64
	canceled, lost, conflicts, nothing, sleeps        atomic.Int64
	paused, capped                                    atomic.Int64
	slept                                             atomic.Int64 // nanoseconds
	// finishing counts the handlers ending a claim at the moment (handle).
	finishing atomic.Int64

	// member is the loop's place in RunAll's group; nil when it runs
	// alone. Set by RunAll before Run starts.
	member *member
	// Warnings of polls that fail, each logged once with a count (see
	// repeated): claims, session starts, counts of the work left. Owned
	// by Run's goroutine, which the claimer runs on.
	claimWarn, sessionWarn, countWarn repeated
}

// New returns a Loop over conn, or an error wrapping bmdb.ErrInvalidArgument
// naming the bad Config field (Config.Validate's).
func New(conn *bmdb.Connection, cfg Config) (*Loop, error) {
	if conn == nil {
		return nil, fmt.Errorf("%w: worker.New: conn is nil", bmdb.ErrInvalidArgument)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Loop{
		conn: conn, cfg: cfg, batch: bmdb.NewSharedCommit(cfg.CommitShared), ended: make(chan struct{}, 1),
		tracer: tracing.New(conn.TracerProvider()),
	}, nil
}

// Stats returns the loop's figures so far.
func (l *Loop) Stats() Stats {
	return Stats{
		Sessions: l.sessions.Load(), Polls: l.polls.Load(), Claimed: l.claimed.Load(),
		Finished: l.finished.Load(), Failed: l.failed.Load(), Canceled: l.canceled.Load(),
		Lost: l.lost.Load(), Conflicts: l.conflicts.Load(), Asked: l.asked.Load(),
		NothingToDo: l.nothing.Load(), Paused: l.paused.Load(), Capped: l.capped.Load(),
		PollSleeps: l.sleeps.Load(), PollSleep: time.Duration(l.slept.Load()),
	}
}

// ErrAlreadyRunning is returned by Run, and wrapped by RunAll's error, for
// a Loop that was run before (by Run or RunAll).
var ErrAlreadyRunning = errors.New("worker: loop already run (Run or RunAll called twice)")

// ErrPermanent is wrapped, together with the error that caused it, by the
// error Run returns when it met an error that no retry can fix: a
// database error (bmdb.IsPermanent) of a retrieval or a commit that
// selects from a missing table or column, has a syntax error, lacks a
// privilege or mismatches a type, or of a session start; or a retrieval
// that returned an id that is not a machine (bmdb.ErrUnknownMachine, see
// Retrieve). The message names the process, and the machine for a
// commit or the id for a retrieval.
var ErrPermanent = errors.New("worker: permanent error, no retry can fix it")

// Run claims and processes machines until ctx is done, then shuts down: it
// stops claiming, lets in-flight work finish for up to ShutdownGrace,
// cancels the claims still running after that, closes the session, and
// returns nil. A session that expires is replaced after RestartDelay; its
// in-flight work is abandoned (its context is cancelled and its claims are
// taken over by whoever claims them next).
//
// Run also returns, after the same shutdown, in these cases. With
// Config.StopWhenIdle set, once the loop has been idle for that long: with
// nil if no work of the process is left, and otherwise, after waiting up
// to Config.DrainTimeout for it to be done, with a *LeftError (wrapping
// ErrWorkLeft) that says how many machines were in backoff and how many
// claimed by other sessions when it stopped; or, if it could not count
// them, with the database's error. And with an error wrapping
// ErrPermanent and the database error (logged once, as an error) when
// claiming, committing or starting a session fails in a way no retry can
// fix. Transient errors are logged as warnings and retried.
//
// So a nil error from a Loop with StopWhenIdle means that the process had
// nothing left: every machine its Retrieve proposed was processed, none
// is in backoff, and no other session holds a claim of it. A process that
// runs several loops, stages whose input is what others finish, runs
// them with RunAll instead: one loop's idleness is not the pipeline's.
//
// Warnings of polls that fail for a reason a retry may fix are logged
// once, then counted: "(repeated N times in D)" follows when the reason
// changes or ends, and every 30 s while it lasts.
func (l *Loop) Run(ctx context.Context) error {
	if !l.started.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	return l.run(ctx)
}

// run is Run, once started (by Run or RunAll).
func (l *Loop) run(ctx context.Context) error {
	runCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	l.stop = stop
	for runCtx.Err() == nil {
		sess, err := l.conn.StartSession(runCtx)
		if err != nil {
			switch {
			case bmdb.IsPermanent(err):
				l.permanent(fmt.Errorf("%w: worker %s: starting a session: %w", ErrPermanent, l.cfg.Process, err))
			case runCtx.Err() == nil:
				l.sessionWarn.warn(fmt.Sprintf("worker %s: starting session: %v", l.cfg.Process, err))
			}
		} else {
			l.sessionWarn.ok()
			l.sessions.Add(1)
			l.runSession(runCtx, sess)
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(runCtx), l.cfg.ShutdownGrace+time.Second)
			if err := sess.Close(closeCtx); err != nil {
				klog.Warningf("worker %s: closing session: %v", l.cfg.Process, err)
			}
			cancel()
		}
		if runCtx.Err() == nil {
			_ = wait.Sleep(runCtx, l.cfg.RestartDelay)
		}
	}
	l.claimWarn.ok()
	l.sessionWarn.ok()
	l.countWarn.ok()
	if cause := context.Cause(runCtx); cause != errIdle && !errors.Is(cause, context.Cause(ctx)) {
		return cause // l.stop's, before ctx ended: a permanent error, a *LeftError, or why the work left could not be counted
	}
	return nil
}

// permanent ends Run with err, which wraps ErrPermanent, and logs it once:
// the first such error is what Run returns.
func (l *Loop) permanent(err error) {
	l.stopOnce.Do(func() {
		klog.Errorf("%v; stopping the loop", err)
		l.stop(err)
	})
}

// runSession claims and processes machines on sess until ctx is done (and
// in-flight work has ended) or sess ends.
func (l *Loop) runSession(ctx context.Context, sess *bmdb.Session) {
	// workCtx is what the Handler runs under: it ends with the session, or
	// ShutdownGrace after ctx.
	workCtx, cancelWork := context.WithCancelCause(sess.Context())
	defer cancelWork(nil)
	stopGrace := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(l.cfg.ShutdownGrace, func() { cancelWork(errShutdown) })
		context.AfterFunc(workCtx, func() { t.Stop() })
	})
	defer stopGrace()

	// claimCtx ends claiming: at shutdown or when the session ends.
	claimCtx, cancelClaims := context.WithCancel(ctx)
	defer cancelClaims()
	stopClaims := context.AfterFunc(sess.Context(), cancelClaims)
	defer stopClaims()

	lostBefore := l.lost.Load()
	var handlers sync.WaitGroup
	l.claimer(claimCtx, workCtx, sess, &handlers)
	handlers.Wait()
	if err := sess.Err(); err != nil && ctx.Err() == nil {
		// One warning for the session's end, not one per claim it took
		// along (those are logged at -v=1).
		klog.Warningf("worker %s: session %s ended: %v; %d claims lost with it; starting a new session in %v",
			l.cfg.Process, sess.ID(), err, l.lost.Load()-lostBefore, l.cfg.RestartDelay)
	}
}

// errShutdown is the cause of the work context once ShutdownGrace is over.
var errShutdown = errors.New("worker: shutdown grace period over")

// claimer claims machines for the free handlers, and starts a handler for
// each machine claimed, until claimCtx ends. busy holds a token per handler
// at work (or about to be): the claimer waits for one to be free, then
// claims for every free one in one call. A handler gives its token back
// when its Work returns, before its claim is ended, and holds one of
// ending's tokens until then: the loop holds at most 2*Concurrency claims.
func (l *Loop) claimer(claimCtx, workCtx context.Context, sess *bmdb.Session, handlers *sync.WaitGroup) {
	busy := make(chan struct{}, l.cfg.Concurrency)   // a token per running handler
	ending := make(chan struct{}, l.cfg.Concurrency) // a token per end in flight
	poll := l.cfg.PollMin
	widen := 0              // consecutive conflicts: candidates are widened 2^widen times
	var idleSince time.Time // since when claims found nothing and no handler ran
	paused := false         // the last claim call found the process paused
	capped := false         // the last claim calls found the process at its cap, and got no more since
	var dr drain            // StopWhenIdle's wait for work left
	defer l.member.busy()   // between sessions, or stopping: not idle
	for {
		select {
		case busy <- struct{}{}:
		case <-claimCtx.Done():
			return
		}
		free := 1
	more:
		for free < l.cfg.Concurrency {
			select {
			case busy <- struct{}{}:
				free++
			default:
				break more
			}
		}
		works, err := l.claim(claimCtx, sess, free, widen)
		for range free - len(works) {
			<-busy
		}
		if p := errors.Is(err, bmdb.ErrProcessPaused); p != paused && claimCtx.Err() == nil {
			paused = p
			if p {
				klog.Infof("worker %s: the process is paused fleet-wide: claiming nothing until it is resumed", l.cfg.Process)
			} else {
				klog.Infof("worker %s: the process was resumed: claiming again", l.cfg.Process)
			}
		}
		if err != nil {
			if claimCtx.Err() != nil {
				return
			}
			if errors.Is(err, bmdb.ErrWorkConflict) && widen < conflictWiden {
				// Work exists, but these candidates were taken by other
				// sessions: look wider at once.
				widen++
				continue
			}
			// Paused or at its cap: not idle (work may be left), but
			// waiting like it.
			held := errors.Is(err, bmdb.ErrProcessPaused) || errors.Is(err, bmdb.ErrCapReached)
			idle := !held && (errors.Is(err, bmdb.ErrNothingToDo) || errors.Is(err, bmdb.ErrWorkConflict))
			switch {
			case bmdb.IsPermanent(err):
				l.permanent(fmt.Errorf("%w: worker %s: claiming: %w", ErrPermanent, l.cfg.Process, err))
				return
			case errors.Is(err, bmdb.ErrUnknownMachine):
				// Retrieve runs in the claim's transaction, on the snapshot
				// the claim checks: an id it returns that is not a machine
				// is not a race a retry outlives but a bug of the
				// retrieval, which returns it again on every poll.
				l.permanent(fmt.Errorf("%w: worker %s: claiming: Config.Retrieve returned an id that is not a machine, a bug in the retrieval: %w", ErrPermanent, l.cfg.Process, err))
				return
			case !idle && !held:
				l.claimWarn.warn(fmt.Sprintf("worker %s: claiming: %v", l.cfg.Process, err))
			default:
				l.claimWarn.ok()
			}
			delay := poll - rand.N(poll/2+1)
			if l.cfg.StopWhenIdle > 0 {
				switch {
				case !idle || len(busy) > 0 || len(ending) > 0:
					idleSince = time.Time{}
					l.member.busy()
				case idleSince.IsZero():
					idleSince = time.Now()
				case time.Since(idleSince) >= l.cfg.StopWhenIdle && l.drained(claimCtx, sess, time.Since(idleSince), &dr, err):
					return
				}
				if !idleSince.IsZero() {
					// Poll again when the idle time is up, or the drain's, to stop then.
					delay = max(min(delay, l.untilStop(idleSince, &dr)), 0)
				}
			}
			capped = errors.Is(err, bmdb.ErrCapReached)
			if capped && (len(busy) > 0 || len(ending) > 0) {
				// A slot frees when one of this loop's claims ends:
				// claim again then, or after the usual wait.
				l.sleepUntil(claimCtx, delay, l.ended)
			} else {
				l.sleep(claimCtx, delay)
			}
			poll = min(2*poll, l.cfg.PollMax)
			continue
		}
		l.claimWarn.ok()
		idleSince = time.Time{}
		l.member.busy()
		poll, widen = l.cfg.PollMin, 0
		for _, w := range works {
			handlers.Go(func() { l.handle(claimCtx, workCtx, sess, w, busy, ending) })
		}
		if capped = capped && len(works) < free; capped {
			// Short of slots: the next claim would find the cap reached.
			// Claim again when one of this loop's claims ends.
			l.sleepUntil(claimCtx, l.cfg.PollMax, l.ended)
		}
	}
}

// handle is a handler goroutine, started with w: it runs Config.Work and
// ends the claim, and, as long as the Work succeeds, the loop runs and no
// other handler of the loop is finishing a successful Work, asks in the same call for
// its next machine (Work.FinishAndWork: one transaction per machine),
// working on it in turn. It holds its busy token
// throughout, and gives it back when it has no next machine. Otherwise
// (an error to Fail, shutdown, a next claim that found nothing) it gives
// the token back before the claim ends, holding one of ending's tokens
// until then, so that the claimer may claim meanwhile.
func (l *Loop) handle(claimCtx, workCtx context.Context, sess *bmdb.Session, w *bmdb.Work, busy, ending chan struct{}) {
	freed := false
	free := func() {
		if !freed {
			freed = true
			<-busy
			l.wakeClaimer()
		}
	}
	defer free() // also if Work exits its goroutine
	for w != nil {
		// The machine's span: a child of the loop's, linked to the batch
		// that claimed it; the Handler and the end run under it.
		machineCtx, span := l.startHandle(claimCtx, workCtx, w)
		if claimCtx.Err() != nil {
			// Claimed as shutdown began (a claim transaction runs for all
			// its callers): give it back unworked.
			err := l.bounded(machineCtx, w.Cancel)
			l.record(machineCtx, w, &l.canceled, err)
			span.End(endOutcome("canceled", err), nil)
			return
		}
		commit, err := l.cfg.Work(machineCtx, w)
		counted := false
		if err == nil && sess.Context().Err() == nil && claimCtx.Err() == nil {
			if counted = true; l.finishing.Add(1) == 1 {
				// Alone in ending a claim: its Finish carries its next
				// claim, one transaction for both.
				var outcome string
				w, outcome = l.finishAndClaim(claimCtx, machineCtx, sess, w, commit)
				l.finishing.Add(-1)
				span.End(outcome, nil)
				continue
			}
			// Others are ending claims too: their Finishes share a batch,
			// and the claimer claims for all the freed handlers in one call
			// (one retrieval, one claim statement), rather than each
			// Finish carrying a claim of its own.
		}
		// The handler is done: its slot goes to the next claim.
		ending <- struct{}{}
		free()
		outcome := l.endClaim(machineCtx, w, commit, err)
		if counted {
			l.finishing.Add(-1)
		}
		span.End(outcome, err)
		<-ending
		return
	}
}

// startHandle starts the span of w's handling, worker.handle, a child of
// loopCtx's span, under workCtx, linked to the span of the batch that
// claimed w; it returns workCtx with it. Off, it returns workCtx and a
// span that does nothing.
func (l *Loop) startHandle(loopCtx, workCtx context.Context, w *bmdb.Work) (context.Context, tracing.Span) {
	if !l.tracer.On() {
		return workCtx, tracing.Span{}
	}
	ctx, span := l.tracer.Start(l.tracer.ContextWithParent(workCtx, loopCtx), "worker.handle")
	if span.Recording() {
		span.Link(w.BatchSpanContext())
		span.SetAttributes(tracing.Process.String(l.cfg.Process), tracing.Machine.String(w.Machine().String()),
			tracing.ClaimID.String(w.ClaimID().String()), tracing.FencingToken.Int64(w.FencingToken()))
	}
	return ctx, span
}

// endOutcome is the outcome of a handling whose end returned err, had it
// succeeded: ok, or why not.
func endOutcome(ok string, err error) string {
	switch {
	case err == nil:
		return ok
	case lost(err):
		return "lost"
	}
	return "end_failed"
}

// finishAndClaim finishes w with commit and claims the handler's next
// machine in the same call, and returns it (nil if none was claimed, or
// the Finish failed: then it has ended w as endClaim does), and the
// outcome of w's handling, for its span.
func (l *Loop) finishAndClaim(claimCtx, workCtx context.Context, sess *bmdb.Session, w *bmdb.Work, commit func(*bmdb.Tx) error) (*bmdb.Work, string) {
	var opts []bmdb.FinishOption
	switch {
	case commit == nil && l.batch != nil:
		opts = []bmdb.FinishOption{bmdb.CommitShared(l.batch)}
	case commit == nil:
		commit = func(*bmdb.Tx) error { return nil }
	}
	l.polls.Add(1)
	l.asked.Add(1)
	var next *bmdb.Work
	var claimErr error
	err := l.bounded(workCtx, func(ctx context.Context) error {
		var err error
		next, claimErr, err = w.FinishAndWork(ctx, commit, l.retrieve(claimCtx, 0), opts...)
		return err
	})
	if err != nil {
		return nil, l.finishFailed(workCtx, w, err)
	}
	l.record(workCtx, w, &l.finished, nil)
	claimed := 0
	if next != nil {
		claimed = 1
	}
	l.countClaim(claimed, claimErr)
	switch {
	case next != nil:
		l.member.busy()
	case claimErr == nil, errors.Is(claimErr, bmdb.ErrNothingToDo), errors.Is(claimErr, bmdb.ErrWorkConflict):
	case bmdb.IsPermanent(claimErr):
		l.permanent(fmt.Errorf("%w: worker %s: claiming: %w", ErrPermanent, l.cfg.Process, claimErr))
	case errors.Is(claimErr, bmdb.ErrUnknownMachine):
		l.permanent(fmt.Errorf("%w: worker %s: claiming: Config.Retrieve returned an id that is not a machine, a bug in the retrieval: %w", ErrPermanent, l.cfg.Process, claimErr))
	default:
		l.claimWarn.warn(fmt.Sprintf("worker %s: claiming: %v", l.cfg.Process, claimErr))
	}
	return next, "finished"
}

// conflictWiden bounds how many times in a row a claimer that lost all its
// candidates to other sessions doubles its candidates and claims again at
// once.
const conflictWiden = 3

// wakeClaimer wakes the claimer if it waits for one of the loop's claims
// to end (ended).
func (l *Loop) wakeClaimer() {
	select {
	case l.ended <- struct{}{}:
	default:
	}
}

// sleep waits d (or until ctx ends, or the loop's group asks for a poll)
// between claim calls, and counts it.
func (l *Loop) sleep(ctx context.Context, d time.Duration) { l.sleepUntil(ctx, d, l.member.woken()) }

// sleepUntil is sleep, ended early by a receive on wake (nil: never).
func (l *Loop) sleepUntil(ctx context.Context, d time.Duration, wake <-chan struct{}) {
	start := time.Now()
	t := time.NewTimer(d)
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-wake:
	}
	t.Stop()
	l.sleeps.Add(1)
	l.slept.Add(int64(time.Since(start)))
}

// claim claims up to n machines in one call, with Candidates<<widen
// candidates (at most 2^20), shuffled.
func (l *Loop) claim(ctx context.Context, sess *bmdb.Session, n, widen int) ([]*bmdb.Work, error) {
	l.polls.Add(1)
	l.asked.Add(int64(n))
	spanCtx, span := l.tracer.Start(ctx, "worker.claim")
	works, err := sess.WorkMany(spanCtx, l.cfg.Process, n, l.retrieve(ctx, widen))
	l.countClaim(len(works), err)
	if span.Recording() {
		span.SetAttributes(tracing.Process.String(l.cfg.Process), tracing.Limit.Int(n), tracing.Claimed.Int(len(works)))
		outcome, failed := claims.Outcome(err)
		span.End(outcome, failed)
	} else {
		span.End("", nil)
	}
	return works, err
}

// retrieve is Config.Retrieve for a claim, with Candidates<<widen
// candidates (at most 2^20), shuffled, so that loops of other processes
// spread over them. The handlers' claims that share a batch share its
// result (Tx.Once): one retrieval per batch and size, which each claim
// shuffles its own way, and bmdb deals distinct candidates to them.
func (l *Loop) retrieve(ctx context.Context, widen int) func(tx *bmdb.Tx) ([]uuid.UUID, error) {
	candidates := int32(min(l.cfg.Candidates<<widen, 1<<20))
	return func(tx *bmdb.Tx) ([]uuid.UUID, error) {
		shared, err := tx.Once(retrieval{l, candidates}, func() (any, error) {
			return l.cfg.Retrieve(ctx, tx, candidates)
		})
		if err != nil {
			return nil, err
		}
		ids := slices.Clone(shared.([]uuid.UUID))
		rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		return ids, nil
	}
}

// retrieval is the key of a Loop's retrieval of a number of candidates in
// a transaction (Tx.Once).
type retrieval struct {
	l          *Loop
	candidates int32
}

// countClaim counts a claim call's outcome: the machines it claimed, or,
// if none, err's kind.
func (l *Loop) countClaim(claimed int, err error) {
	switch {
	case claimed > 0:
		l.claimed.Add(int64(claimed))
	case errors.Is(err, bmdb.ErrWorkConflict):
		l.conflicts.Add(1)
	case errors.Is(err, bmdb.ErrProcessPaused):
		l.paused.Add(1)
	case errors.Is(err, bmdb.ErrCapReached):
		l.capped.Add(1)
	case errors.Is(err, bmdb.ErrNothingToDo):
		l.nothing.Add(1)
	}
}

// endClaim ends one claim after Config.Work returned commit and err, and
// returns the outcome of its handling, for its span.
func (l *Loop) endClaim(workCtx context.Context, w *bmdb.Work, commit func(*bmdb.Tx) error, err error) string {
	sessCtx := w.Session().Context()
	if sessCtx.Err() != nil {
		// The claim went with the session: nothing can end it now.
		l.lost.Add(1)
		klog.V(1).Infof("worker %s: claim of %s lost: %v", l.cfg.Process, w.Machine(), context.Cause(sessCtx))
		return "lost"
	}
	switch {
	case err == nil:
		finish := func(ctx context.Context) error { return w.Finish(ctx, commit) }
		switch {
		case commit == nil && l.batch != nil:
			finish = func(ctx context.Context) error { return w.Finish(ctx, nil, bmdb.CommitShared(l.batch)) }
		case commit == nil:
			finish = func(ctx context.Context) error { return w.Finish(ctx, func(*bmdb.Tx) error { return nil }) }
		}
		if err := l.bounded(workCtx, finish); err != nil {
			return l.finishFailed(workCtx, w, err)
		}
		l.record(workCtx, w, &l.finished, nil)
		return "finished"
	case errors.Is(context.Cause(workCtx), errShutdown):
		endErr := l.bounded(workCtx, w.Cancel)
		l.record(workCtx, w, &l.canceled, endErr)
		return endOutcome("canceled", endErr)
	default:
		endErr := l.bounded(workCtx, func(ctx context.Context) error {
			return w.Fail(ctx, &l.cfg.Backoff, err.Error())
		})
		l.record(workCtx, w, &l.failed, endErr)
		return endOutcome("failed", endErr)
	}
}

// finishFailed handles the failure err of w's Finish: a claim gone is
// counted lost; otherwise the commit itself failed (or its outcome is
// unknown): the loop backs off rather than retry it at once, with Fail
// (which, if the Finish did commit, finds the claim gone). It returns the
// outcome of w's handling, for its span.
func (l *Loop) finishFailed(workCtx context.Context, w *bmdb.Work, err error) string {
	if lost(err) {
		l.record(workCtx, w, &l.finished, err)
		return "lost"
	}
	named := fmt.Errorf("worker %s: finishing machine %s: %w", l.cfg.Process, w.Machine(), err)
	if bmdb.IsPermanent(err) {
		l.permanent(fmt.Errorf("%w: %w", ErrPermanent, named))
	} else {
		klog.Warningf("%v", named)
	}
	failErr := l.bounded(workCtx, func(ctx context.Context) error {
		return w.Fail(ctx, &l.cfg.Backoff, "finish failed: "+err.Error())
	})
	l.record(workCtx, w, &l.failed, failErr)
	return endOutcome("finish_failed", failErr)
}

// bounded runs one call that ends a claim. It must not be cut short by
// shutdown: it is bounded by the session (Transact aborts when it ends) and
// by a timeout of its own.
func (l *Loop) bounded(workCtx context.Context, end func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(workCtx), l.cfg.ShutdownGrace+time.Second)
	defer cancel()
	return end(ctx)
}

// record counts how a claim ended; if ending it failed for another reason than
// losing it, it cancels the claim, so that it does not stay held.
func (l *Loop) record(workCtx context.Context, w *bmdb.Work, counter *atomic.Int64, err error) {
	defer l.wakeClaimer()
	switch {
	case err == nil:
		counter.Add(1)
	case lost(err):
		l.lost.Add(1)
		klog.V(1).Infof("worker %s: claim of %s lost: %v", l.cfg.Process, w.Machine(), err)
	default:
		klog.Warningf("worker %s: ending claim of %s: %v; canceling it", l.cfg.Process, w.Machine(), err)
		l.cancelUntilSettled(workCtx, w)
	}
}

// cancelUntilSettled cancels w, retrying with jittered, growing waits until
// it succeeds or the claim is gone, so that a claim is never left held by a
// live session (a stuck machine). It gives up when workCtx ends: the
// session ended (the claim went with it) or shutdown is over (Close removes
// the claim).
func (l *Loop) cancelUntilSettled(workCtx context.Context, w *bmdb.Work) {
	delay := l.cfg.PollMin
	var warned repeated
	defer warned.ok()
	for {
		err := l.bounded(workCtx, w.Cancel)
		switch {
		case err == nil:
			l.canceled.Add(1)
			return
		case lost(err):
			l.lost.Add(1)
			return
		}
		warned.warn(fmt.Sprintf("worker %s: canceling claim of %s: %v; retrying", l.cfg.Process, w.Machine(), err))
		if wait.Sleep(workCtx, delay-rand.N(delay/2+1)) != nil {
			l.lost.Add(1)
			return
		}
		delay = min(2*delay, l.cfg.PollMax)
	}
}

// lost reports whether err says the claim is gone, or already ended
// (ErrWorkDone: an earlier end found it gone).
func lost(err error) bool {
	return errors.Is(err, bmdb.ErrWorkLost) || errors.Is(err, bmdb.ErrSessionExpired) ||
		errors.Is(err, bmdb.ErrSessionClosed) || errors.Is(err, bmdb.ErrWorkDone)
}
