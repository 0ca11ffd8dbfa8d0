package main

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/worker"
)

// loopOnce seeds m machines and processes them with worker.Loop, the
// default path of a component: a per-machine handler (here: commit the
// pending tag's deletion) and n handlers in all, spread over procs
// Connections (procs > 1 stands for separate processes: each has its own
// pool, session and claim transactions, and they race for the same
// machines). It stops when every machine is done and checks that each was
// finished exactly once. With groupCommit, the handler returns no commit
// and worker.Config.Commit deletes the pending tags of all the machines
// finished in one transaction in one statement. Claim latency is not
// measured (the loop does not expose it); attempts and retries add up over
// the Connections.
func loopOnce(ctx context.Context, dsn string, m, n, procs int, groupCommit bool) (result, check, error) {
	const process = "bench"
	conns := make([]*bmdb.Connection, procs)
	for i := range conns {
		c, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: fmt.Sprintf("bench-loop-%d", i), SkipMigrations: true})
		if err != nil {
			return result{}, check{}, err
		}
		defer c.Close()
		conns[i] = c
	}
	db := conns[0].DB()
	if err := seed(ctx, db, m); err != nil {
		return result{}, check{}, err
	}
	before := make([]bmdb.Stats, procs)
	for i, c := range conns {
		before[i] = c.Stats()
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	loops := make([]*worker.Loop, procs)
	start := time.Now()
	for i, c := range conns {
		l, err := worker.New(c, worker.Config{
			Process:     process,
			Concurrency: max(1, n/procs),
			Retrieve: func(ctx context.Context, tx *bmdb.Tx, limit int32) ([]uuid.UUID, error) {
				return query(ctx, tx, process, int(limit), 0)
			},
			Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
				if groupCommit {
					return nil, nil // committed by Commit, with the others of its transaction
				}
				return finishCommit(ctx, w), nil
			},
			CommitShared: func(tx *bmdb.Tx, works []*bmdb.Work) error {
				return commitMany(ctx, tx, works)
			},
			PollMin: time.Millisecond,
			PollMax: 16 * time.Millisecond,
		})
		if err != nil {
			return result{}, check{}, err
		}
		loops[i] = l
		wg.Go(func() { _ = l.Run(runCtx) })
	}
	err := waitPendingEmpty(ctx, db)
	elapsed := time.Since(start)
	stop()
	wg.Wait()
	if err != nil {
		return result{}, check{}, err
	}
	r := result{items: m, elapsed: elapsed}
	for i, c := range conns {
		st := c.Stats()
		r.attempts += st.TxAttempts - before[i].TxAttempts
		r.retries += st.TxRetries - before[i].TxRetries
		r.conflicts += loops[i].Stats().Conflicts
	}
	chk, err := verify(ctx, db, process)
	if err == nil && (chk.none != 0 || chk.many != 0) {
		err = fmt.Errorf("exactly-once check failed: %s", chk)
	}
	return r, chk, err
}

// waitPendingEmpty polls until no machine is pending, i.e. every Finish has
// committed.
func waitPendingEmpty(ctx context.Context, db *sql.DB) error {
	for {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM bench_pending").Scan(&n); err != nil {
			return fmt.Errorf("counting pending machines: %w", err)
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}
