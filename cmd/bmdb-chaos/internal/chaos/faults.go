package chaos

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/bmdb-dev/bmdb/internal/wait"
)

// FaultKind names a kind of injected fault.
type FaultKind string

// The fault kinds. Every CI run injects each at least once.
const (
	// FaultKill kills a worker with SIGKILL mid-work and restarts it.
	FaultKill FaultKind = "kill"
	// FaultPGRestart restarts PostgreSQL (fast shutdown, start) under load.
	FaultPGRestart FaultKind = "pg-restart"
	// FaultTerminate runs pg_terminate_backend on a worker's connections.
	FaultTerminate FaultKind = "terminate"
	// FaultPartition cuts a worker's proxy for longer than the session
	// interval, resetting or blackholing its connections, then heals it.
	FaultPartition FaultKind = "partition"
	// FaultStall stops a worker (SIGSTOP) for longer than the session
	// interval, then lets it go on (SIGCONT) and try to Finish.
	FaultStall FaultKind = "stall"
	// FaultLockTable holds LOCK TABLE work (ACCESS EXCLUSIVE) in an
	// operator's transaction for longer than the session interval, as a
	// careless migration would: claims and ends wait (lock_timeout) and
	// retry, heartbeats go on.
	FaultLockTable FaultKind = "lock-table"
	// FaultMaxConnections makes the server refuse a worker's new
	// connections with too_many_connections (53300), as when
	// max_connections is reached: the workers' role's CONNECTION LIMIT
	// is lowered to the connections it has, for longer than the interval.
	FaultMaxConnections FaultKind = "max-connections"
	// FaultCommitKill terminates a worker's backend exactly as its COMMIT
	// is in flight (its proxy spots the COMMIT): before the server read
	// it, or racing it. The worker cannot tell whether it committed.
	FaultCommitKill FaultKind = "commit-kill"
	// FaultCommitStall blackholes a worker's network exactly as the
	// COMMIT of a Finish (one that wrote an effect) is sent, and delivers it (and what follows) once every session of
	// the worker has passed its deadline: the server must not commit it
	// (the last check before COMMIT lowered the idle timeout to the lease
	// left).
	FaultCommitStall FaultKind = "commit-stall"
)

// FaultKinds lists every kind, in a fixed order.
var FaultKinds = []FaultKind{FaultKill, FaultPGRestart, FaultTerminate, FaultPartition, FaultStall,
	FaultLockTable, FaultMaxConnections, FaultCommitKill, FaultCommitStall}

// Log markers the harness writes into a worker's log around faults.
const (
	markStop = "SIGSTOP"
	markCont = "SIGCONT"
	markCut  = "partition cut"
	markHeal = "partition healed"
)

// Fault is one injected fault.
type Fault struct {
	Kind   FaultKind
	Worker int // the target worker, -1 for the database
	Detail string
	Took   time.Duration
}

// inject injects one fault of kind and records it, on the database clock,
// in chaos_fault.
func (h *harness) inject(ctx context.Context, kind FaultKind) error {
	f := Fault{Kind: kind, Worker: -1}
	var w *proc
	if kind != FaultPGRestart && kind != FaultLockTable && kind != FaultMaxConnections {
		w = h.fleet.procs[h.rng.IntN(len(h.fleet.procs))]
		f.Worker = w.cfg.ID
	}
	target := "postgres"
	if w != nil {
		target = fmt.Sprintf("worker-%d", w.cfg.ID)
	}
	id, err := h.faultBegin(ctx, kind, target)
	if err != nil {
		return err
	}
	start := time.Now()
	long := h.cfg.Interval + time.Duration(h.rng.Int64N(int64(h.cfg.Interval)))*3/2 + h.cfg.Interval/2 // 1.5 to 3 intervals
	switch kind {
	case FaultKill:
		w.mark("SIGKILL")
		if err := h.fleet.kill(w); err != nil {
			return fmt.Errorf("chaos: killing worker %d: %w", w.cfg.ID, err)
		}
		down := 200*time.Millisecond + time.Duration(h.rng.Int64N(int64(1300*time.Millisecond)))
		if err := wait.Sleep(ctx, down); err != nil {
			return err
		}
		if err := h.fleet.start(w); err != nil {
			return err
		}
		f.Detail = fmt.Sprintf("restarted after %v", down.Round(time.Millisecond))
	case FaultPGRestart:
		if err := h.cluster.Restart(ctx); err != nil {
			return err
		}
	case FaultTerminate:
		var n int
		err := h.retry(ctx, func(ctx context.Context) error {
			return h.db.QueryRowContext(ctx, terminateSQL, w.appName).Scan(&n)
		})
		if err != nil {
			return fmt.Errorf("chaos: terminating backends of worker %d: %w", w.cfg.ID, err)
		}
		w.mark("pg_terminate_backend of %d connections", n)
		f.Detail = fmt.Sprintf("%d backends", n)
	case FaultPartition:
		blackhole := h.rng.IntN(2) == 0
		mode := "reset"
		if blackhole {
			mode = "blackhole"
		}
		w.mark("%s (%s) for %v", markCut, mode, long.Round(time.Millisecond))
		w.proxy.Cut(blackhole)
		err := wait.Sleep(ctx, long)
		w.proxy.Heal()
		w.mark(markHeal)
		if err != nil {
			return err
		}
		f.Detail = fmt.Sprintf("%s for %v", mode, long.Round(time.Millisecond))
		h.partitionModes[mode]++
	case FaultStall:
		w.mark("%s for %v", markStop, long.Round(time.Millisecond))
		if err := h.fleet.signal(w, syscall.SIGSTOP); err != nil {
			return fmt.Errorf("chaos: stopping worker %d: %w", w.cfg.ID, err)
		}
		err := wait.Sleep(ctx, long)
		w.mark(markCont) // before it runs again, so that its lines follow
		if cerr := h.fleet.signal(w, syscall.SIGCONT); cerr != nil && err == nil {
			err = fmt.Errorf("chaos: continuing worker %d: %w", w.cfg.ID, cerr)
		}
		if err != nil {
			return err
		}
		f.Detail = fmt.Sprintf("stopped for %v", long.Round(time.Millisecond))
	case FaultLockTable:
		if f.Detail, err = h.lockTable(ctx, long); err != nil {
			return err
		}
	case FaultMaxConnections:
		if f.Detail, err = h.refuseConnections(ctx, long); err != nil {
			return err
		}
	case FaultCommitKill, FaultCommitStall:
		if f.Detail, err = h.atCommit(ctx, w, kind); err != nil {
			return err
		}
	}
	f.Took = time.Since(start)
	if err := h.faultEnd(ctx, id, f.Detail); err != nil {
		return err
	}
	h.faults = append(h.faults, f)
	h.faultCount.Add(1)
	fmt.Fprintf(h.cfg.Out, "bmdb-chaos: %6.1fs fault %-10s %-9s %s\n", time.Since(h.began).Seconds(), kind, target, f.Detail)
	return nil
}

// schedule returns the CI mode's faults: every kind once, then random
// kinds up to n, in a seeded random order.
func (h *harness) schedule(n int) []FaultKind {
	all := h.cfg.kinds()
	kinds := append([]FaultKind(nil), all...)
	for len(kinds) < n {
		kinds = append(kinds, all[h.rng.IntN(len(all))])
	}
	h.rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	return kinds
}

func (h *harness) faultBegin(ctx context.Context, kind FaultKind, target string) (int64, error) {
	var id int64
	err := h.retry(ctx, func(ctx context.Context) error {
		return h.db.QueryRowContext(ctx, faultBeginSQL, string(kind), target, "").Scan(&id)
	})
	if err != nil {
		return 0, fmt.Errorf("chaos: recording fault: %w", err)
	}
	return id, nil
}

func (h *harness) faultEnd(ctx context.Context, id int64, detail string) error {
	err := h.retry(ctx, func(ctx context.Context) error {
		_, err := h.db.ExecContext(ctx, faultEndSQL, id, detail)
		return err
	})
	if err != nil {
		return fmt.Errorf("chaos: recording fault: %w", err)
	}
	return nil
}

// retry runs fn until it succeeds, for up to 30 s: the database may be
// restarting.
func (h *harness) retry(ctx context.Context, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		err := fn(actx)
		acancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		if err := wait.Sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// lockTable holds LOCK TABLE work for d in a transaction of its own.
func (h *harness) lockTable(ctx context.Context, d time.Duration) (string, error) {
	lctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	var waited time.Duration
	err := h.retry(lctx, func(ctx context.Context) error {
		tx, err := h.db.BeginTx(lctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		start := time.Now()
		if _, err := tx.ExecContext(ctx, `LOCK TABLE work IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		waited = time.Since(start)
		if err := wait.Sleep(lctx, d); err != nil {
			return err
		}
		return tx.Commit()
	})
	if err != nil {
		return "", fmt.Errorf("chaos: locking the work table: %w", err)
	}
	return fmt.Sprintf("held %v (acquired in %v)", d.Round(time.Millisecond), waited.Round(time.Millisecond)), nil
}

// refuseConnections lowers the workers' role's connection limit to the
// connections it has for d, then lifts it.
func (h *harness) refuseConnections(ctx context.Context, d time.Duration) (string, error) {
	var n int
	err := h.retry(ctx, func(ctx context.Context) error {
		return h.db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE usename = $1`, workerRole).Scan(&n)
	})
	if err == nil {
		err = h.retry(ctx, func(ctx context.Context) error {
			_, err := h.db.ExecContext(ctx, limitWorkersSQL, n)
			return err
		})
	}
	if err != nil {
		return "", fmt.Errorf("chaos: limiting connections: %w", err)
	}
	serr := wait.Sleep(ctx, d)
	err = h.retry(context.WithoutCancel(ctx), func(ctx context.Context) error {
		_, err := h.db.ExecContext(ctx, limitWorkersSQL, -1)
		return err
	})
	if err = errors.Join(serr, err); err != nil {
		return "", fmt.Errorf("chaos: lifting the connection limit: %w", err)
	}
	return fmt.Sprintf("at %d connections for %v", n, d.Round(time.Millisecond)), nil
}

// commitWait bounds how long a commit fault waits for the worker's next
// COMMIT.
const commitWait = 10 * time.Second

// atCommit arms w's proxy for its next COMMIT and injects kind there:
// FaultCommitKill terminates the backend (at random before the COMMIT is
// forwarded, or right after, racing it); FaultCommitStall waits for a
// Finish's COMMIT and blackholes the proxy, holding the COMMIT, until
// every session of the worker has passed its deadline (stallPast: the
// blackhole keeps their heartbeats from the server), then delivers it.
func (h *harness) atCommit(ctx context.Context, w *proc, kind FaultKind) (string, error) {
	type hit struct {
		port  int
		after bool
	}
	fired := make(chan hit, 1)
	after := h.rng.IntN(2) == 0
	marker := "" // any COMMIT
	if kind == FaultCommitStall {
		marker = "chaos_effect" // a Finish's, which commits an effect
	}
	w.proxy.OnCommit(marker, func(port int) func() {
		if kind == FaultCommitStall {
			w.mark("%s (at a COMMIT)", markCut)
			w.proxy.Cut(true)
			fired <- hit{port: port}
			return nil
		}
		kill := func() { h.terminatePort(port) }
		fired <- hit{port: port, after: after}
		if after {
			return kill
		}
		kill()
		return nil
	})
	var got hit
	select {
	case got = <-fired:
	case <-time.After(commitWait):
		w.proxy.OnCommit("", nil)
		return "no COMMIT seen", nil
	case <-ctx.Done():
		w.proxy.OnCommit("", nil)
		return "", ctx.Err()
	}
	if kind == FaultCommitKill {
		w.mark("pg_terminate_backend at COMMIT")
		if got.after {
			return "backend killed as its COMMIT was forwarded", nil
		}
		return "backend killed before its COMMIT arrived", nil
	}
	stall, err := h.stallPast(ctx, w)
	if err == nil {
		err = wait.Sleep(ctx, stall)
	}
	w.proxy.Heal()
	w.mark(markHeal)
	h.partitionModes["commit"]++
	return fmt.Sprintf("COMMIT held for %v", stall.Round(time.Millisecond)), err
}

// stallPast returns how long to hold w's network so that every session of
// w passes its deadline first: the longest lease they have left, and a
// margin. Below the session interval, which is the connections' idle
// timeout before the last check lowers it, the hold tells whether that
// check ran (TestPlantedBugs).
func (h *harness) stallPast(ctx context.Context, w *proc) (time.Duration, error) {
	var lease float64
	err := h.retry(ctx, func(ctx context.Context) error {
		return h.db.QueryRowContext(ctx, `SELECT COALESCE(max(EXTRACT(EPOCH FROM deadline - clock_timestamp())), 0)::FLOAT8
			FROM sessions WHERE component_name = $1`, w.appName).Scan(&lease)
	})
	if err != nil {
		return 0, fmt.Errorf("chaos: reading leases: %w", err)
	}
	return max(time.Duration(lease*float64(time.Second)), 0) + commitStallMargin, nil
}

// commitStallMargin is how long after the last deadline of its worker's
// sessions a held COMMIT is delivered.
const commitStallMargin = 150 * time.Millisecond

// terminatePort terminates the backend whose client port is port.
func (h *harness) terminatePort(port int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = h.db.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE client_port = $1`, port)
}
