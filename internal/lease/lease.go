// Package lease is a session's liveness in the database: a sessions row
// whose deadline one goroutine, the heartbeat, keeps extending on the
// database clock, a local deadline (by the monotonic clock) that is never
// later than the database's, the checks every transaction of the session
// runs (first, and right before COMMIT: Lease is the transaction's
// txn.Guard), garbage collection of expired sessions, and the core of a
// takeover: superseding an expired session, which orders every
// transaction it still has open before the takeover or aborts it.
//
// It sits on package txn (the runner); the batch engine (package claims)
// and bmdb's Session sit on it.
package lease

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/internal/counters"
	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/txn"
)

// Sentinel errors, which bmdb exports under the same names
// (bmdb/errors.go documents them).
var (
	ErrSessionExpired = errors.New("bmdb: session expired")
	ErrSessionClosed  = errors.New("bmdb: session closed")
)

// Config is what a Lease needs of its Connection.
type Config struct {
	ComponentName, RuntimeInfo string
	// Interval is the session's lifetime without a successful heartbeat,
	// on the database clock (bmdb.Config.SessionInterval).
	Interval time.Duration
	// Lifetime is how long after the start of a successful heartbeat the
	// session counts itself alive: Interval, less the clock margin on
	// CockroachDB (bmdb.Config.MaxClockOffset).
	Lifetime time.Duration
	// IdleInTransaction is the connections' own
	// idle_in_transaction_session_timeout: the most a check lowers it to.
	IdleInTransaction time.Duration
	// GCPeriod is how often the heartbeat goroutine runs a GC pass.
	GCPeriod time.Duration
	// ObserveHeartbeat, if not nil, receives each successful heartbeat's
	// duration (bmdb's histogram).
	ObserveHeartbeat func(time.Duration)
}

// Hooks let tests inside the module inject faults; a Lease reads them at
// each use, so tests may set them after it started. Zero means none.
type Hooks struct {
	// BeforeHeartbeat runs before every heartbeat attempt; a non-nil error fails
	// that attempt as if the database had returned it.
	BeforeHeartbeat func(ctx context.Context) error
	// AfterSessionCheck runs inside every session transaction right after
	// its first session check, e.g. to hold one there while another
	// commits.
	AfterSessionCheck func(session uuid.UUID)
	// BeforeCommit runs inside every session transaction after its last
	// liveness check, right before COMMIT (RELEASE on CockroachDB).
	BeforeCommit func(session uuid.UUID)
}

// Lease is one session. Safe for concurrent use. Its heartbeat goroutine
// is the only goroutine it starts; Close waits for it.
type Lease struct {
	id        uuid.UUID
	cfg       Config
	runner    *txn.Runner
	collector *Collector
	counters  *counters.Counters
	hooks     *Hooks

	// ctx is cancelled, with ErrSessionClosed or an error wrapping
	// ErrSessionExpired as its cause, when the session ends.
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when the heartbeat goroutine has returned

	// localDeadline is when the session is dead by the local monotonic
	// clock: Lifetime after the start of the last successful heartbeat.
	// The database never expires it earlier. Written by the heartbeat.
	localDeadline atomic.Pointer[time.Time]
	// expiry fires at the local deadline and ends the session unless a
	// heartbeat moved the deadline meanwhile, whatever the heartbeat
	// goroutine is doing.
	expiry *time.Timer
}

// Start inserts a new session row and starts its heartbeat goroutine. ctx
// bounds only the start. collector runs a GC pass every Config.GCPeriod on
// the heartbeat goroutine; hooks may be nil.
func Start(ctx context.Context, runner *txn.Runner, collector *Collector, cfg Config, hooks *Hooks) (*Lease, error) {
	if hooks == nil {
		hooks = &Hooks{}
	}
	start := time.Now()
	var id uuid.UUID
	err := runner.Run(ctx, txn.Serializable, nil, func(tx *txn.Tx) error {
		var err error
		id, err = tx.Store().SessionStart(ctx, store.SessionStartParams{
			ComponentName:   cfg.ComponentName,
			RuntimeInfo:     cfg.RuntimeInfo,
			IntervalSeconds: cfg.Interval.Seconds(),
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("bmdb: starting session: %w", err)
	}
	sctx, cancel := context.WithCancelCause(context.Background())
	l := &Lease{
		id: id, cfg: cfg, runner: runner, collector: collector, counters: runner.Counters, hooks: hooks,
		ctx: sctx, cancel: cancel, done: make(chan struct{}),
	}
	l.setLocalDeadline(start.Add(cfg.Lifetime))
	l.expiry = time.AfterFunc(time.Hour, l.expireLocally)
	l.expiry.Reset(time.Until(*l.localDeadline.Load()))
	l.counters.SessionsStarted.Add(1)
	go l.heartbeat()
	klog.V(1).Infof("bmdb: session %s of %q started (interval %v)", id, cfg.ComponentName, cfg.Interval)
	return l, nil
}

// ID returns the session's id.
func (l *Lease) ID() uuid.UUID { return l.id }

// Interval returns the session interval.
func (l *Lease) Interval() time.Duration { return l.cfg.Interval }

// Lifetime returns how long after a successful heartbeat the session
// counts itself alive.
func (l *Lease) Lifetime() time.Duration { return l.cfg.Lifetime }

// Context is cancelled when the session ends, with its cause.
func (l *Lease) Context() context.Context { return l.ctx }

// Done is closed when the session has ended and its heartbeat goroutine
// has returned.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err returns nil while the session is alive, and once it has ended why.
func (l *Lease) Err() error {
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// Alive returns nil if the session may still be used, and otherwise why
// not: ended, or past its local deadline.
func (l *Lease) Alive() error {
	if l.ctx.Err() != nil {
		return context.Cause(l.ctx)
	}
	if !time.Now().Before(*l.localDeadline.Load()) {
		return l.expiredLocally()
	}
	return nil
}

// Bound returns ctx, also cancelled, with the session's cause, when the
// session ends; stop releases it.
func (l *Lease) Bound(ctx context.Context) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	unhook := context.AfterFunc(l.ctx, func() { cancel(context.Cause(l.ctx)) })
	return ctx, func() {
		unhook()
		cancel(nil)
	}
}

// Close ends the session: it stops the heartbeat goroutine and waits for
// it, then, in one transaction bounded by ctx and by the session interval,
// deletes the session row and its claims, recording them as Canceled (or
// as Abandoned if the session had already expired). It returns the event
// and the processes of the claims it ended. Not idempotent: bmdb's
// Session calls it once.
func (l *Lease) Close(ctx context.Context) (store.WorkHistoryEvent, []string, error) {
	l.cancel(ErrSessionClosed)
	<-l.done
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Interval)
	defer cancel()
	var event store.WorkHistoryEvent
	var ended []string
	err := l.runner.Run(ctx, txn.Serializable, nil, func(tx *txn.Tx) error {
		event = store.WorkHistoryEventCanceled
		q := tx.Store()
		if _, err := q.SessionCheck(ctx, l.id); isNoRows(err) {
			event = store.WorkHistoryEventAbandoned
		} else if err != nil {
			return err
		}
		var err error
		ended, err = q.WorkEndSession(ctx, store.WorkEndSessionParams{
			Event: event, SessionID: l.id, ComponentName: l.cfg.ComponentName,
		})
		if err != nil {
			return err
		}
		_, err = q.SessionDelete(ctx, l.id)
		return err
	})
	if err != nil {
		return event, nil, fmt.Errorf("bmdb: deleting session %s: %w", l.id, err)
	}
	klog.V(1).Infof("bmdb: session %s closed", l.id)
	return event, ended, nil
}

// expiredLocally is the error of a session past its local deadline.
func (l *Lease) expiredLocally() error {
	return fmt.Errorf("%w: no successful heartbeat for %v (local deadline)", ErrSessionExpired, l.cfg.Lifetime)
}

// expireLocally runs when the expiry timer fires: it ends the session if
// the local deadline has passed, and otherwise waits for the new one.
func (l *Lease) expireLocally() {
	if left := time.Until(*l.localDeadline.Load()); left > 0 {
		l.expiry.Reset(left)
		return
	}
	l.cancel(l.expiredLocally())
}

// Expire ends the session because the database says it has expired.
func (l *Lease) Expire() {
	l.cancel(fmt.Errorf("%w: deadline passed on the database clock", ErrSessionExpired))
}

func (l *Lease) setLocalDeadline(t time.Time) { l.localDeadline.Store(&t) }
