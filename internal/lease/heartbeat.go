package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/internal/txn"
	"github.com/bmdb-dev/bmdb/internal/wait"
)

// heartbeat is the session's goroutine. It extends the deadline every
// Lifetime/2, runs a GC pass every GCPeriod, and closes done when the
// session ends.
func (l *Lease) heartbeat() {
	defer close(l.done)
	defer func() {
		if errors.Is(context.Cause(l.ctx), ErrSessionExpired) {
			l.counters.SessionsExpired.Add(1)
		}
	}()
	defer l.expiry.Stop()
	beat := time.NewTimer(l.cfg.Lifetime / 2)
	defer beat.Stop()
	gc := time.NewTimer(jitterGCPeriod(l.cfg.GCPeriod))
	defer gc.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-beat.C:
			if err := l.extend(); err != nil {
				if !errors.Is(err, ErrSessionClosed) {
					klog.Warningf("bmdb: session %s of %q ended: %v", l.id, l.cfg.ComponentName, err)
				}
				l.cancel(err)
				return
			}
			beat.Reset(time.Until(l.localDeadline.Load().Add(-l.cfg.Lifetime / 2)))
		case <-gc.C:
			l.collectGarbage()
			gc.Reset(jitterGCPeriod(l.cfg.GCPeriod))
		}
	}
}

// extend extends the session's deadline, retrying transient failures until
// the local deadline. It returns an error wrapping ErrSessionExpired when
// the database has expired the session or the local deadline passes, and
// the session's cause when the session is closed meanwhile.
func (l *Lease) extend() error {
	for attempt := 1; ; attempt++ {
		deadline := *l.localDeadline.Load()
		start := time.Now()
		if !start.Before(deadline) {
			return l.expiredLocally()
		}
		extended, err := l.heartbeatOnce(deadline)
		switch {
		case err == nil && extended:
			l.setLocalDeadline(start.Add(l.cfg.Lifetime))
			if observe := l.cfg.ObserveHeartbeat; observe != nil {
				observe(time.Since(start))
			}
			return nil
		case err == nil:
			return fmt.Errorf("%w: deadline passed on the database clock", ErrSessionExpired)
		case l.ctx.Err() != nil:
			return context.Cause(l.ctx)
		}
		l.counters.HeartbeatFailures.Add(1)
		klog.Warningf("bmdb: session %s heartbeat attempt %d failed: %v", l.id, attempt, err)
		delay := min(l.cfg.Interval/20, time.Until(deadline))
		if err := wait.Sleep(l.ctx, delay); err != nil {
			return err
		}
	}
}

// heartbeatOnce makes one heartbeat attempt bounded by deadline, and reports
// whether the database extended the session.
func (l *Lease) heartbeatOnce(deadline time.Time) (bool, error) {
	ctx, cancel := context.WithDeadline(l.ctx, deadline)
	defer cancel()
	if hook := l.hooks.BeforeHeartbeat; hook != nil {
		if err := hook(ctx); err != nil {
			return false, err
		}
	}
	var rows int64
	err := l.runner.Run(ctx, txn.Serializable, nil, func(tx *txn.Tx) error {
		var err error
		rows, err = tx.Store().SessionHeartbeat(ctx, l.id)
		return err
	})
	return rows == 1, err
}

// collectGarbage runs one periodic GC pass (gc.go) on behalf of the
// session, on the heartbeat goroutine, bounded so that it cannot delay the
// next heartbeat: it ends by the time that heartbeat is due, and within
// Interval/4.
func (l *Lease) collectGarbage() {
	if l.collector == nil {
		return
	}
	budget := min(l.cfg.Interval/4, time.Until(l.localDeadline.Load().Add(-l.cfg.Lifetime/2)))
	if budget < 10*time.Millisecond {
		return // a heartbeat is due: the next period collects
	}
	ctx, cancel := context.WithTimeout(l.ctx, budget)
	defer cancel()
	n, _, err := l.collector.Pass(ctx)
	switch {
	case err != nil && l.ctx.Err() == nil && ctx.Err() == nil:
		klog.Warningf("bmdb: session %s: garbage collection failed: %v", l.id, err)
	case n > 0:
		klog.V(1).Infof("bmdb: session %s: garbage collection deleted %d expired sessions", l.id, n)
	}
}

// jitterGCPeriod returns p shortened by up to 25%, so that components do
// not collect garbage in lockstep.
func jitterGCPeriod(p time.Duration) time.Duration {
	return p - rand.N(p/4+1)
}
