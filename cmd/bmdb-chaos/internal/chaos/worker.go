package chaos

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/wait"
)

// WorkerConfig configures one worker process of the fleet.
type WorkerConfig struct {
	DSN            string        // through the worker's proxy, with its application_name
	ID             int           // the worker's number in the fleet
	Seed           uint64        // seeds the work durations and the choice of ends
	Interval       time.Duration // bmdb session interval
	GCPeriod       time.Duration // bmdb GC period
	Concurrency    int           // claims worked on at once per Connection
	Connections    int           // Connections (and claim loops) in the process
	WorkMin        time.Duration // shortest simulated work
	WorkMax        time.Duration // longest simulated work
	Serializable   bool          // bmdb.Config.SerializableBatches
	MaxClockOffset time.Duration // bmdb.Config.MaxClockOffset (cockroach mode); 0: bmdb's default
	History        string        // the history file (history.go)

	// Wrap, if not nil, wraps the driver connector of every Connection
	// (bmdb.Config.WrapConnector), above cockroach mode's emulator when
	// crdbmode.EnvVar asks for it: the tests' planted bugs. Not a flag.
	Wrap func(driver.Connector) driver.Connector
}

// Log lines the checker reads in worker logs.
const (
	logClaimed = "chaos: claimed"     // chaos: claimed MACHINE session SESSION
	logDone    = "chaos: done"        // chaos: done MACHINE session SESSION
	logStop    = "chaos: interrupted" // chaos: interrupted MACHINE session SESSION: CAUSE
	logLost    = "chaos: claim of"    // chaos: claim of MACHINE lost: CAUSE
)

// How a worker ends a claim it worked on: mostly Finish, which commits the
// item's effect; sometimes Fail (with backoff) or Cancel, after which the
// item is claimed again, by a new claim with a higher token.
const (
	failShare   = 0.1
	cancelShare = 0.1
)

// Claim loop pacing.
const (
	candidates = 8
	pollMin    = 20 * time.Millisecond
	pollMax    = 200 * time.Millisecond
)

// RunWorker runs one worker process until ctx is done: Connections bmdb
// Connections, each with a claim loop of its own that claims machines for
// Process, works on each for a random duration, and ends the claim,
// recording every operation in the history. It returns once every loop
// has ended its claims and closed its session.
func RunWorker(ctx context.Context, c WorkerConfig) error {
	rec, err := newRecorder(c.History)
	if err != nil {
		return err
	}
	defer rec.close()
	wrap, counts, err := c.wrapper()
	if err != nil {
		return err
	}
	// The probes (sched.go) run until the loops are done. The round
	// trips' connection is bmdb's driver wrapper's, so that a ping cut off
	// by a fault ends with its context.
	connector, err := dbconn.NewConnector(c.DSN, pingTimeout, dbconn.Settings{}, nil)
	if err != nil {
		return fmt.Errorf("chaos: the probe's connection: %w", err)
	}
	ping := sql.OpenDB(connector)
	defer ping.Close()
	ping.SetMaxOpenConns(1)
	probeCtx, stopProbe := context.WithCancel(context.WithoutCancel(ctx))
	var probes sync.WaitGroup
	probes.Go(func() { probeScheduling(probeCtx, rec) })
	probes.Go(func() { probeDatabase(probeCtx, ping, rec) })
	conns := max(c.Connections, 1)
	errs := make([]error, conns)
	var wg sync.WaitGroup
	for i := range conns {
		l := &loop{c: c, n: i, rec: rec, rng: rand.New(rand.NewPCG(c.Seed, uint64(os.Getpid())<<8|uint64(i)))}
		wg.Go(func() { errs[i] = l.run(ctx, wrap) })
	}
	wg.Wait()
	stopProbe()
	probes.Wait()
	if counts != nil {
		klog.Infof("chaos: worker %d: %s", c.ID, counts.Report())
	}
	return errors.Join(errs...)
}

// wrapper returns the connector wrapper of the process's Connections:
// cockroach mode's emulator, if its environment variable is set, under
// c.Wrap.
func (c WorkerConfig) wrapper() (func(driver.Connector) driver.Connector, *crdbmode.Counts, error) {
	mode, err := crdbmode.FromEnv()
	if err != nil {
		return nil, nil, err
	}
	var counts *crdbmode.Counts
	wrap := c.Wrap
	if mode.Enabled {
		counts = &crdbmode.Counts{}
		wrap = func(inner driver.Connector) driver.Connector {
			outer := crdbmode.New(mode, counts).Wrap(inner)
			if c.Wrap != nil {
				outer = c.Wrap(outer)
			}
			return outer
		}
	}
	return wrap, counts, nil
}

// loop is one Connection's claim loop.
type loop struct {
	c   WorkerConfig
	n   int
	rec *recorder

	mu  sync.Mutex // guards rng: handlers draw from it
	rng *rand.Rand
}

func (l *loop) float() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rng.Float64()
}

func (l *loop) duration(lo, hi time.Duration) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return lo + time.Duration(l.rng.Int64N(int64(hi-lo)+1))
}

// run opens the Connection and runs sessions one after the other until
// ctx is done.
func (l *loop) run(ctx context.Context, wrap func(driver.Connector) driver.Connector) error {
	conn, err := openRetrying(ctx, bmdb.Config{
		DSN:                 l.c.DSN,
		ComponentName:       fmt.Sprintf("chaos-w%d", l.c.ID),
		RuntimeInfo:         fmt.Sprintf("bmdb-chaos worker %d, connection %d, pid %d", l.c.ID, l.n, os.Getpid()),
		SessionInterval:     l.c.Interval,
		GCPeriod:            l.c.GCPeriod,
		SkipMigrations:      true,
		SerializableBatches: l.c.Serializable,
		MaxClockOffset:      l.c.MaxClockOffset,
		WrapConnector:       wrap,
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	klog.Infof("chaos: worker %d (pid %d) loop %d running", l.c.ID, os.Getpid(), l.n)
	for ctx.Err() == nil {
		id := l.rec.invoke(record{Kind: opSessionStart})
		sess, err := conn.StartSession(ctx)
		if err != nil {
			l.rec.returned(id, err, nil)
			klog.Warningf("chaos: starting session: %v", err)
			_ = wait.Sleep(ctx, 100*time.Millisecond)
			continue
		}
		l.rec.write(record{ID: id, Return: monotonic(), Out: outOK, Session: sess.ID()})
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			<-sess.Done()
			l.rec.sessionEnded(sess.ID(), sess.Err())
			if err := sess.Err(); !errors.Is(err, bmdb.ErrSessionClosed) {
				klog.Warningf("chaos: session %s ended: %v", sess.ID(), err) // checkLog looks for it after a stall
			}
		}()
		l.session(ctx, sess)
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*l.c.Interval)
		if err := sess.Close(closeCtx); err != nil {
			klog.Warningf("chaos: closing session %s: %v", sess.ID(), err)
		}
		cancel()
		<-ended
	}
	klog.Infof("chaos: worker %d loop %d stopped: %+v", l.c.ID, l.n, conn.Stats())
	return nil
}

// session claims and works on machines with sess until ctx is done or the
// session ends, and then waits for its handlers.
func (l *loop) session(ctx context.Context, sess *bmdb.Session) {
	claimCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(sess.Context(), cancel)()
	slots := make(chan struct{}, l.c.Concurrency)
	var handlers sync.WaitGroup
	defer handlers.Wait()
	poll := pollMin
	for {
		select {
		case slots <- struct{}{}:
		case <-claimCtx.Done():
			return
		}
		free := 1
	more:
		for ; free < l.c.Concurrency; free++ {
			select {
			case slots <- struct{}{}:
			default:
				break more
			}
		}
		works, err := l.claim(claimCtx, sess, free)
		for range free - len(works) {
			<-slots
		}
		for _, w := range works {
			handlers.Go(func() {
				defer func() { <-slots }()
				l.handle(sess, w)
			})
		}
		if err == nil {
			poll = pollMin
			continue
		}
		if claimCtx.Err() != nil {
			return
		}
		if !errors.Is(err, bmdb.ErrNothingToDo) && !errors.Is(err, bmdb.ErrWorkConflict) {
			klog.Warningf("chaos: claiming: %v", err)
		}
		_ = wait.Sleep(claimCtx, l.duration(poll/2, poll))
		poll = min(2*poll, pollMax)
	}
}

// claim claims up to n machines, recording the operation.
func (l *loop) claim(ctx context.Context, sess *bmdb.Session, n int) ([]*bmdb.Work, error) {
	id := l.rec.invoke(record{Kind: opClaim, Session: sess.ID()})
	works, err := sess.WorkMany(ctx, Process, n, func(tx *bmdb.Tx) ([]uuid.UUID, error) {
		ids, err := retrieve(ctx, tx, candidates)
		rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		return ids, err
	})
	var got []claimed
	for _, w := range works {
		got = append(got, claimed{Machine: w.Machine(), Claim: w.ClaimID(), Token: w.FencingToken()})
	}
	l.rec.returned(id, err, got)
	return works, err
}

// handle works on w until its work is done or its session ends, then
// ends the claim: Finish, which commits the item's effect, or sometimes
// Fail or Cancel. An end that fails without the claim being gone is
// followed by Cancels until one settles it, so that no claim stays held
// by a live session. Every end is recorded, including those the session's
// end dooms: their outcome is part of the history.
func (l *loop) handle(sess *bmdb.Session, w *bmdb.Work) {
	m, s := w.Machine(), sess.ID()
	klog.Infof("%s %s session %s", logClaimed, m, s)
	if err := wait.Sleep(sess.Context(), l.duration(l.c.WorkMin, l.c.WorkMax)); err != nil {
		klog.Infof("%s %s session %s: %v", logStop, m, s, err)
	} else {
		klog.Infof("%s %s session %s", logDone, m, s)
	}
	kind := opFinish
	switch r := l.float(); {
	case r < failShare:
		kind = opFail
	case r < failShare+cancelShare:
		kind = opCancel
	}
	for delay := pollMin; ; delay = min(2*delay, pollMax) {
		err := l.end(w, kind)
		switch {
		case err == nil:
			return
		case errors.Is(err, bmdb.ErrWorkLost) || errors.Is(err, bmdb.ErrSessionExpired) ||
			errors.Is(err, bmdb.ErrSessionClosed) || errors.Is(err, bmdb.ErrWorkDone):
			klog.Infof("%s %s lost: %v", logLost, m, err)
			return
		}
		klog.Warningf("chaos: %s of %s: %v; canceling it", kind, m, err)
		if wait.Sleep(sess.Context(), delay) != nil {
			klog.Infof("%s %s lost: %v", logLost, m, context.Cause(sess.Context()))
			return
		}
		kind = opCancel
	}
}

// end runs one end of w, recording it.
func (l *loop) end(w *bmdb.Work, kind string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*l.c.Interval)
	defer cancel()
	id := l.rec.invoke(record{Kind: kind, Session: w.Session().ID(), Machine: w.Machine(), Claim: w.ClaimID()})
	var err error
	switch kind {
	case opFinish:
		err = w.Finish(ctx, func(tx *bmdb.Tx) error {
			_, err := tx.DBTX().ExecContext(ctx, insertEffectSQL, w.Machine(), w.Session().ID(), l.c.ID, w.ClaimID(), w.FencingToken())
			if err != nil {
				return fmt.Errorf("chaos: recording effect of %s: %w", w.Machine(), err)
			}
			return nil
		})
	case opFail:
		err = w.Fail(ctx, &bmdb.Backoff{Initial: 50 * time.Millisecond, Maximum: 500 * time.Millisecond, Exponent: 2}, "chaos: planned failure")
	default:
		err = w.Cancel(ctx)
	}
	l.rec.returned(id, err, nil)
	return err
}

// outcome classifies err for the history.
func outcome(err error) (out, msg string) {
	switch {
	case err == nil:
		return outOK, ""
	case errors.Is(err, bmdb.ErrAmbiguousCommit): // first: a COMMIT cut by the session's end says both
		out = outAmbiguous
	case errors.Is(err, bmdb.ErrWorkLost):
		out = outLost
	case errors.Is(err, bmdb.ErrSessionExpired) || errors.Is(err, bmdb.ErrSessionClosed):
		out = outExpired
	default:
		out = outError
	}
	return out, err.Error()
}

// retrieve proposes machines without effect and without a live claim.
func retrieve(ctx context.Context, tx *bmdb.Tx, limit int32) ([]uuid.UUID, error) {
	rows, err := tx.DBTX().QueryContext(ctx, retrieveSQL, Process, limit)
	if err != nil {
		return nil, fmt.Errorf("chaos: retrieving: %w", err)
	}
	defer rows.Close()
	var ids []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("chaos: retrieving: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("chaos: retrieving: %w", err)
	}
	return ids, nil
}

// openRetrying opens bmdb, retrying while the database is unreachable (it
// may be restarting or partitioned away) until ctx is done.
func openRetrying(ctx context.Context, cfg bmdb.Config) (*bmdb.Connection, error) {
	for {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := bmdb.Open(octx, cfg)
		cancel()
		if err == nil {
			return conn, nil
		}
		if errors.Is(err, bmdb.ErrInvalidArgument) || ctx.Err() != nil {
			return nil, err
		}
		klog.Warningf("chaos: opening bmdb: %v; retrying", err)
		if err := wait.Sleep(ctx, 200*time.Millisecond); err != nil {
			return nil, err
		}
	}
}
