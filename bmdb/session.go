package bmdb

import (
	"context"
	"database/sql"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/claims"
	"github.com/bmdb-dev/bmdb/internal/lease"
	"github.com/bmdb-dev/bmdb/internal/txn"
)

// Session is a component's liveness in the database: a sessions row whose
// deadline one goroutine, owned by the Session, keeps extending. Claims taken
// with Work belong to the session and die with it.
//
// A Session is safe for concurrent use. It ends either by Close or by
// expiry; either way Done is closed and every later method call returns
// ErrSessionClosed or an error wrapping ErrSessionExpired. Close must be
// called in both cases to stop using it and delete its row. The heartbeat
// goroutine is the only goroutine a Session starts: its claims and ends run
// on their callers' goroutines (see "Batches" in the package doc).
type Session struct {
	conn   *Connection
	lease  *lease.Lease
	claims *claims.Engine

	closeOnce sync.Once
	closeErr  error
}

// StartSession inserts a new session row and starts its heartbeat
// goroutine. ctx bounds only the start; the session lives until Close or
// expiry.
func (c *Connection) StartSession(ctx context.Context) (*Session, error) {
	if c.closed() {
		return nil, ErrConnectionClosed
	}
	cfg := c.cfg
	l, err := lease.Start(ctx, c.runner, c.collector, lease.Config{
		ComponentName: cfg.ComponentName, RuntimeInfo: cfg.RuntimeInfo,
		Interval: cfg.SessionInterval, Lifetime: c.sessionLifetime(),
		IdleInTransaction: c.settings.IdleInTransaction, GCPeriod: cfg.GCPeriod,
		ObserveHeartbeat: func(d time.Duration) {
			c.metrics.heartbeatSeconds.WithLabelValues(cfg.ComponentName).Observe(d.Seconds())
		},
	}, &c.leaseHooks)
	if err != nil {
		return nil, err
	}
	engine := claims.New(c.runner, l, claims.Config{
		ComponentName: cfg.ComponentName, MaxBatchSize: cfg.MaxBatchSize,
		MaxConcurrentBatches: cfg.MaxConcurrentBatches, Isolation: c.batchTx, Cockroach: c.engine == engineCockroach,
		Tracer: c.tracer,
		ObserveClaim: func(process string, d time.Duration) {
			c.metrics.claimSeconds.WithLabelValues(cfg.ComponentName, process).Observe(d.Seconds())
		},
	})
	return &Session{conn: c, lease: l, claims: engine}, nil
}

// ID returns the session's id, the session_id of its row.
func (s *Session) ID() uuid.UUID { return s.lease.ID() }

// Context returns a context that is cancelled when the session ends, with
// ErrSessionClosed or an error wrapping ErrSessionExpired as its cause
// (context.Cause). Work done under a claim should use it, so that it stops
// when the claim can no longer be finished.
func (s *Session) Context() context.Context { return s.lease.Context() }

// Done returns a channel that is closed when the session has ended and its
// heartbeat goroutine has exited.
func (s *Session) Done() <-chan struct{} { return s.lease.Done() }

// Err returns nil while the session is alive, and once it has ended (its
// Context is done; Done may still be closing) why: ErrSessionClosed, or an
// error wrapping ErrSessionExpired.
func (s *Session) Err() error { return s.lease.Err() }

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
		event, ended, err := s.lease.Close(ctx)
		s.closeErr = err
		s.conn.counters.Events(ended, event)
	})
	return s.closeErr
}

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
func (s *Session) Transact(ctx context.Context, fn func(tx *Tx) error) (err error) {
	ctx, span := s.conn.tracer.Start(ctx, "bmdb.Transact")
	attempts := 0
	defer func() { endTransact(span, attempts, err) }()
	if fn == nil {
		return invalidArgument("Transact: fn is nil")
	}
	attempts, err = s.transactCounted(ctx, txn.Serializable, fn)
	return err
}

// transact runs fn in a transaction of the session at opts' isolation
// (Transact without argument checks), aborted if the session ends: each
// attempt checks the session first, runs fn, and checks it again right
// before COMMIT (the lease, as the transaction's guard, unless nothing ran
// since the first check).
func (s *Session) transact(ctx context.Context, opts *sql.TxOptions, fn func(tx *Tx) error) error {
	_, err := s.transactCounted(ctx, opts, fn)
	return err
}

// transactCounted is transact that also returns how many attempts it
// began.
func (s *Session) transactCounted(ctx context.Context, opts *sql.TxOptions, fn func(tx *Tx) error) (int, error) {
	if err := s.lease.Alive(); err != nil {
		return 0, err
	}
	ctx, stop := s.lease.Bound(ctx)
	defer stop()
	return s.conn.runner.RunCounted(ctx, opts, s.lease, func(tx *txn.Tx) error {
		if err := s.lease.Check(ctx, tx); err != nil {
			return err
		}
		return fn(newTx(tx))
	})
}
