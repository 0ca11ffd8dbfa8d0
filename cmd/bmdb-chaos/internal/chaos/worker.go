package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/worker"
)

// WorkerConfig configures one worker process of the fleet.
type WorkerConfig struct {
	DSN         string        // through the worker's proxy, with its application_name
	ID          int           // the worker's number in the fleet
	Seed        uint64        // seeds the work durations
	Interval    time.Duration // bmdb session interval
	GCPeriod    time.Duration // bmdb GC period
	Concurrency int           // handlers per loop
	Connections int           // Connections (and loops) in the process
	WorkMin     time.Duration // shortest simulated work
	WorkMax     time.Duration // longest simulated work
}

// Log lines the checker reads in worker logs.
const (
	logClaimed = "chaos: claimed"     // chaos: claimed MACHINE session SESSION
	logDone    = "chaos: done"        // chaos: done MACHINE session SESSION
	logStop    = "chaos: interrupted" // chaos: interrupted MACHINE session SESSION: CAUSE
)

// RunWorker runs one worker process until ctx is done: Connections bmdb
// Connections, each with a worker.Loop claiming machines for Process,
// simulating work for a random duration, and committing an effect row in
// Finish. It returns once every loop has shut down and its session is
// closed.
func RunWorker(ctx context.Context, c WorkerConfig) error {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(c.Seed, uint64(os.Getpid())))
	duration := func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return c.WorkMin + time.Duration(rng.Int64N(int64(c.WorkMax-c.WorkMin)+1))
	}
	conns := max(c.Connections, 1)
	errs := make([]error, conns)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() { errs[i] = runLoop(ctx, c, i, duration) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// runLoop runs the worker's loop number n on a Connection of its own.
func runLoop(ctx context.Context, c WorkerConfig, n int, duration func() time.Duration) error {
	conn, err := openRetrying(ctx, bmdb.Config{
		DSN:             c.DSN,
		ComponentName:   fmt.Sprintf("chaos-w%d", c.ID),
		RuntimeInfo:     fmt.Sprintf("bmdb-chaos worker %d, connection %d, pid %d", c.ID, n, os.Getpid()),
		SessionInterval: c.Interval,
		GCPeriod:        c.GCPeriod,
		SkipMigrations:  true,
	})
	if err != nil {
		return err
	}
	defer conn.Close()

	loop, err := worker.New(conn, worker.Config{
		Process: Process,
		Retrieve: func(ctx context.Context, tx *bmdb.Tx, limit int32) ([]uuid.UUID, error) {
			return retrieve(ctx, tx, limit)
		},
		Work: func(ctx context.Context, w *bmdb.Work) (func(tx *bmdb.Tx) error, error) {
			m, s := w.Machine(), w.Session().ID()
			klog.Infof("%s %s session %s", logClaimed, m, s)
			t := time.NewTimer(duration())
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				klog.Infof("%s %s session %s: %v", logStop, m, s, context.Cause(ctx))
				return nil, context.Cause(ctx)
			}
			klog.Infof("%s %s session %s", logDone, m, s)
			return func(tx *bmdb.Tx) error {
				if _, err := tx.DBTX().ExecContext(ctx, insertEffectSQL, m, s, c.ID); err != nil {
					return fmt.Errorf("chaos: recording effect of %s: %w", m, err)
				}
				return nil
			}, nil
		},
		Concurrency:   c.Concurrency,
		Candidates:    8,
		PollMin:       20 * time.Millisecond,
		PollMax:       200 * time.Millisecond,
		ShutdownGrace: 2 * time.Second,
		RestartDelay:  100 * time.Millisecond,
		Backoff:       bmdb.Backoff{Initial: 50 * time.Millisecond, Maximum: 500 * time.Millisecond, Exponent: 2},
	})
	if err != nil {
		return err
	}
	klog.Infof("chaos: worker %d (pid %d) loop %d running", c.ID, os.Getpid(), n)
	err = loop.Run(ctx)
	klog.Infof("chaos: worker %d loop %d stopped: %+v", c.ID, n, loop.Stats())
	return err
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
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
