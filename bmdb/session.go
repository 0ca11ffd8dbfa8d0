package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/wait"
)

// Session is a component's liveness in the database: a sessions row whose
// deadline one goroutine, owned by the Session, keeps extending. Claims taken
// with Work belong to the session and die with it.
//
// A Session is safe for concurrent use. It ends either by Close or by
// expiry; either way Done is closed and every later method call returns
// ErrSessionClosed or an error wrapping ErrSessionExpired. Close must be
// called in both cases to stop using it and delete its row.
type Session struct {
	conn     *Connection
	id       uuid.UUID
	interval time.Duration

	// ctx is cancelled, with ErrSessionClosed or ErrSessionExpired as its
	// cause, when the session ends.
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{}

	// lifetime is how long after the start of a successful heartbeat the
	// session counts itself alive: the interval, less the clock margin on
	// CockroachDB.
	lifetime time.Duration

	// localDeadline is when the session is dead by the local monotonic
	// clock: lifetime after the start of the last successful heartbeat.
	// The database never expires it earlier.
	localDeadline atomic.Pointer[time.Time]
	// expiry fires at the local deadline and ends the session unless a
	// heartbeat moved the deadline meanwhile, whatever the heartbeat
	// goroutine is doing.
	expiry *time.Timer

	// batchers run the session's claims and ends, one per process
	// (batcher.go). Written by callers of Work, WorkMany and the ends,
	// under batchersMu; each batcher's goroutine exits with the session.
	batchersMu sync.Mutex
	batchers   map[string]*batcher

	closeOnce sync.Once
	closeErr  error
}

// StartSession inserts a new session row and starts its heartbeat
// goroutine. ctx bounds only the start; the session lives until Close or
// expiry.
func (c *Connection) StartSession(ctx context.Context) (*Session, error) {
	start := time.Now()
	var id uuid.UUID
	err := c.transact(ctx, serializable, func(tx *Tx) error {
		var err error
		id, err = tx.q.SessionStart(ctx, store.SessionStartParams{
			ComponentName:   c.cfg.ComponentName,
			RuntimeInfo:     c.cfg.RuntimeInfo,
			IntervalSeconds: c.cfg.SessionInterval.Seconds(),
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("bmdb: starting session: %w", err)
	}
	sctx, cancel := context.WithCancelCause(context.Background())
	s := &Session{
		conn:     c,
		id:       id,
		interval: c.cfg.SessionInterval,
		lifetime: c.sessionLifetime(),
		ctx:      sctx,
		cancel:   cancel,
		done:     make(chan struct{}),
	}
	s.setLocalDeadline(start.Add(s.lifetime))
	s.expiry = time.AfterFunc(time.Hour, s.expireLocally)
	s.expiry.Reset(time.Until(*s.localDeadline.Load()))
	c.stats.sessionsStarted.Add(1)
	go s.heartbeat()
	klog.V(1).Infof("bmdb: session %s of %q started (interval %v)", id, c.cfg.ComponentName, s.interval)
	return s, nil
}

// ID returns the session's id, the session_id of its row.
func (s *Session) ID() uuid.UUID { return s.id }

// Context returns a context that is cancelled when the session ends, with
// ErrSessionClosed or an error wrapping ErrSessionExpired as its cause
// (context.Cause). Work done under a claim should use it, so that it stops
// when the claim can no longer be finished.
func (s *Session) Context() context.Context { return s.ctx }

// Done returns a channel that is closed when the session has ended and its
// heartbeat goroutine has exited.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err returns nil while the session is alive, and once it has ended (its
// Context is done; Done may still be closing) why: ErrSessionClosed, or an
// error wrapping ErrSessionExpired.
func (s *Session) Err() error {
	if s.ctx.Err() == nil {
		return nil
	}
	return context.Cause(s.ctx)
}

// Close ends the session: it stops the heartbeat goroutine and waits for it,
// then, in one transaction bounded by ctx and by the session interval,
// deletes the session row and its claims, recording them as Canceled (or as
// Abandoned if the session had already expired). In-flight transactions of
// the session are aborted.
//
// Close is idempotent and may be called after expiry; every call returns
// the first call's result.
func (s *Session) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.cancel(ErrSessionClosed)
		<-s.done
		s.closeErr = s.release(ctx)
		klog.V(1).Infof("bmdb: session %s closed", s.id)
	})
	return s.closeErr
}

// release deletes the session row and its claims with their history.
func (s *Session) release(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.interval)
	defer cancel()
	var event store.WorkHistoryEvent
	var ended []string
	err := s.conn.transact(ctx, serializable, func(tx *Tx) error {
		event = store.WorkHistoryEventCanceled
		if _, err := tx.q.SessionCheck(ctx, s.id); errors.Is(err, sql.ErrNoRows) {
			event = store.WorkHistoryEventAbandoned
		} else if err != nil {
			return err
		}
		var err error
		ended, err = tx.q.WorkEndSession(ctx, store.WorkEndSessionParams{
			Event: event, SessionID: s.id, ComponentName: s.conn.cfg.ComponentName,
		})
		if err != nil {
			return err
		}
		_, err = tx.q.SessionDelete(ctx, s.id)
		return err
	})
	if err != nil {
		return fmt.Errorf("bmdb: deleting session %s: %w", s.id, err)
	}
	s.conn.stats.events(ended, event)
	return nil
}

// alive returns nil if the session may still be used, and otherwise why not.
func (s *Session) alive() error {
	if s.ctx.Err() != nil {
		return context.Cause(s.ctx)
	}
	if !time.Now().Before(*s.localDeadline.Load()) {
		return s.expiredLocally()
	}
	return nil
}

// expiredLocally is the error of a session past its local deadline.
func (s *Session) expiredLocally() error {
	return fmt.Errorf("%w: no successful heartbeat for %v (local deadline)", ErrSessionExpired, s.lifetime)
}

// expireLocally runs when the expiry timer fires: it ends the session if
// the local deadline has passed, and otherwise waits for the new one.
func (s *Session) expireLocally() {
	if left := time.Until(*s.localDeadline.Load()); left > 0 {
		s.expiry.Reset(left)
		return
	}
	s.cancel(s.expiredLocally())
}

// expire ends the session because the database says it has expired.
func (s *Session) expire() {
	s.cancel(fmt.Errorf("%w: deadline passed on the database clock", ErrSessionExpired))
}

func (s *Session) setLocalDeadline(t time.Time) { s.localDeadline.Store(&t) }

// Transact runs fn in a SERIALIZABLE transaction that first checks, on the
// database clock, that the session is alive; an expired session returns an
// error wrapping ErrSessionExpired and nothing commits. ctx bounds the whole
// call, retries included; the transaction is also aborted if the session
// ends meanwhile.
//
// fn may run several times, once per attempt, each time with a new Tx: it
// must have no side effects outside the transaction, and it must return
// database errors wrapped with %w (never formatted with %v), or the
// serialization failures that drive retries are masked. An error from fn
// rolls the attempt back and is returned (possibly wrapped with the cause of
// a done context; errors.Is and errors.As still see it). Retries exhausted
// return *RetriesExhaustedError; a connection failure during COMMIT returns
// ErrAmbiguousCommit.
func (s *Session) Transact(ctx context.Context, fn func(tx *Tx) error) error {
	if fn == nil {
		return invalidArgument("Transact: fn is nil")
	}
	return s.transact(ctx, serializable, fn)
}

// transact runs fn in a transaction of the session at opts' isolation
// (Transact without argument checks), aborted if the session ends: each
// attempt checks the session, runs fn, and checks the session again right
// before COMMIT.
func (s *Session) transact(ctx context.Context, opts *sql.TxOptions, fn func(tx *Tx) error) error {
	if err := s.alive(); err != nil {
		return err
	}
	ctx, stop := s.bound(ctx)
	defer stop()
	return s.conn.transact(ctx, opts, func(tx *Tx) error {
		if err := s.check(ctx, tx); err != nil {
			return err
		}
		if err := fn(tx); err != nil {
			return err
		}
		return s.checkBeforeCommit(ctx, tx, nil)
	})
}

// bound returns ctx, also cancelled, with the session's cause, when the
// session ends; stop releases it.
func (s *Session) bound(ctx context.Context) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	unhook := context.AfterFunc(s.ctx, func() { cancel(context.Cause(s.ctx)) })
	return ctx, func() {
		unhook()
		cancel(nil)
	}
}

// check verifies inside tx that the session is alive on the database clock.
// Its read of the row orders tx against a takeover or GC, which delete it:
// on PostgreSQL it locks the row until tx ends; on CockroachDB tx commits
// before the delete or fails its read refresh (doc.go).
func (s *Session) check(ctx context.Context, tx *Tx) error {
	_, err := tx.q.SessionCheck(ctx, s.id)
	if errors.Is(err, sql.ErrNoRows) {
		s.expire()
		return context.Cause(s.ctx)
	}
	if err != nil {
		return fmt.Errorf("bmdb: checking session: %w", err)
	}
	if hook := s.conn.hooks.afterSessionCheck; hook != nil {
		hook(s.id)
	}
	return nil
}

// errStaleLease means a transaction outlived the session deadline its
// snapshot saw, while later heartbeats kept the session alive: it is run
// again, with a new snapshot.
var errStaleLease = errors.New("bmdb: transaction outlived the session deadline it saw")

// checks are the session checks of one attempt of a batch's transaction.
// Two of bmdb's batch statements check the session as they run
// (WorkClaimMany, WorkFinishMany: alive at that statement, and the idle
// timeout lowered to the lease left, as SessionCheckBeforeCommit does), so
// that an attempt whose last statement is one of them needs no statement
// of its own before COMMIT. Owned by the batch's goroutine.
type checks struct {
	first bool // a statement of the attempt has checked the session
	last  bool // the last statement run checked it; nothing ran since
}

// checked applies what a statement that checked the session found. Alive:
// nil. Not alive at the attempt's first check: the session has ended on
// the database clock. At a later one: as in checkBeforeCommit.
func (s *Session) checked(c *checks, alive bool) error {
	if !alive {
		if !c.first {
			s.expire()
			return context.Cause(s.ctx)
		}
		return s.staleLease()
	}
	if !c.first {
		c.first = true
		if hook := s.conn.hooks.afterSessionCheck; hook != nil {
			hook(s.id)
		}
	}
	c.last = true
	return nil
}

// staleLease is the error of a check, after the first of its transaction,
// that found the session past the deadline the transaction's snapshot
// holds: the session's own error if it has ended locally too; otherwise a
// heartbeat extended it after the snapshot was taken, and the transaction
// runs again (errStaleLease).
func (s *Session) staleLease() error {
	if err := s.alive(); err != nil {
		return err
	}
	return errStaleLease
}

// maxIdleMs is the idle-in-transaction timeout a check sets: the time the
// session has left, at most the connections' own (SessionInterval), at
// least 1 ms.
func (s *Session) maxIdleMs() int64 {
	left := time.Until(*s.localDeadline.Load())
	return max(min(left, s.conn.settings.IdleInTransaction).Milliseconds(), 1)
}

// checkBeforeCommit is the last liveness check, right before COMMIT: the
// local deadline first, then the database clock, which also lowers the
// server's idle-in-transaction timeout to the time the session has left.
// So a transaction that passes it commits within one round trip, or, if
// the client stalls before COMMIT, is ended by the server: at the deadline
// on PostgreSQL; on CockroachDB, where bmdb does not rely on the lowered
// timeout, one interval after the check (SessionCheckBeforeCommit). If c
// says the attempt's last statement checked the database clock (as
// SessionCheckBeforeCommit does), only the local deadline is checked again.
func (s *Session) checkBeforeCommit(ctx context.Context, tx *Tx, c *checks) error {
	if err := s.alive(); err != nil {
		return err
	}
	if c == nil || !c.last {
		_, err := tx.q.SessionCheckBeforeCommit(ctx, store.SessionCheckBeforeCommitParams{
			SessionID: s.id, MaxIdleMs: s.maxIdleMs(),
		})
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return s.staleLease()
		case err != nil:
			return fmt.Errorf("bmdb: checking session before commit: %w", err)
		}
	}
	if hook := s.conn.hooks.beforeCommit; hook != nil {
		hook(s.id)
	}
	return nil
}

// heartbeat is the session's goroutine. It extends the deadline every
// interval/2, runs GC every GCPeriod, and closes done when the session ends.
func (s *Session) heartbeat() {
	defer close(s.done)
	defer func() {
		if errors.Is(context.Cause(s.ctx), ErrSessionExpired) {
			s.conn.stats.sessionsExpired.Add(1)
		}
	}()
	defer s.expiry.Stop()
	poke := time.NewTimer(s.lifetime / 2)
	defer poke.Stop()
	gc := time.NewTimer(jitterGCPeriod(s.conn.cfg.GCPeriod))
	defer gc.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-poke.C:
			if err := s.poke(); err != nil {
				if !errors.Is(err, ErrSessionClosed) {
					klog.Warningf("bmdb: session %s of %q ended: %v", s.id, s.conn.cfg.ComponentName, err)
				}
				s.cancel(err)
				return
			}
			poke.Reset(time.Until(s.localDeadline.Load().Add(-s.lifetime / 2)))
		case <-gc.C:
			s.collectGarbage()
			gc.Reset(jitterGCPeriod(s.conn.cfg.GCPeriod))
		}
	}
}

// poke extends the session's deadline, retrying transient failures until the
// local deadline. It returns an error wrapping ErrSessionExpired when the
// database has expired the session or the local deadline passes, and the
// session's cause when the session is closed meanwhile.
func (s *Session) poke() error {
	for attempt := 1; ; attempt++ {
		deadline := *s.localDeadline.Load()
		start := time.Now()
		if !start.Before(deadline) {
			return s.expiredLocally()
		}
		extended, err := s.pokeOnce(deadline)
		switch {
		case err == nil && extended:
			s.setLocalDeadline(start.Add(s.lifetime))
			s.conn.metrics.heartbeatSeconds.WithLabelValues(s.conn.cfg.ComponentName).Observe(time.Since(start).Seconds())
			return nil
		case err == nil:
			return fmt.Errorf("%w: deadline passed on the database clock", ErrSessionExpired)
		case s.ctx.Err() != nil:
			return context.Cause(s.ctx)
		}
		s.conn.stats.heartbeatFailures.Add(1)
		klog.Warningf("bmdb: session %s heartbeat attempt %d failed: %v", s.id, attempt, err)
		delay := min(s.interval/20, time.Until(deadline))
		if err := wait.Sleep(s.ctx, delay); err != nil {
			return err
		}
	}
}

// pokeOnce makes one heartbeat attempt bounded by deadline, and reports
// whether the database extended the session.
func (s *Session) pokeOnce(deadline time.Time) (bool, error) {
	ctx, cancel := context.WithDeadline(s.ctx, deadline)
	defer cancel()
	if hook := s.conn.hooks.beforePoke; hook != nil {
		if err := hook(ctx); err != nil {
			return false, err
		}
	}
	var rows int64
	err := s.conn.transact(ctx, serializable, func(tx *Tx) error {
		var err error
		rows, err = tx.q.SessionPoke(ctx, s.id)
		return err
	})
	return rows == 1, err
}

// collectGarbage runs one periodic GC pass (gc.go) on behalf of
// the session, on the heartbeat goroutine, bounded so that it cannot delay
// the next heartbeat: it ends by the time that heartbeat is due, and
// within interval/4.
func (s *Session) collectGarbage() {
	budget := min(s.interval/4, time.Until(s.localDeadline.Load().Add(-s.lifetime/2)))
	if budget < 10*time.Millisecond {
		return // a heartbeat is due: the next period collects
	}
	ctx, cancel := context.WithTimeout(s.ctx, budget)
	defer cancel()
	n, _, err := s.conn.collectGarbage(ctx)
	switch {
	case err != nil && s.ctx.Err() == nil:
		klog.Warningf("bmdb: session %s: garbage collection failed: %v", s.id, err)
	case n > 0:
		klog.V(1).Infof("bmdb: session %s: garbage collection deleted %d expired sessions", s.id, n)
	}
}

// jitterGCPeriod returns p shortened by up to 25%, so that components do not
// collect garbage in lockstep.
func jitterGCPeriod(p time.Duration) time.Duration {
	return p - rand.N(p/4+1)
}
