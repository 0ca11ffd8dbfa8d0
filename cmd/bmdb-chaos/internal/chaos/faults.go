package chaos

import (
	"context"
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
)

// FaultKinds lists every kind, in a fixed order.
var FaultKinds = []FaultKind{FaultKill, FaultPGRestart, FaultTerminate, FaultPartition, FaultStall}

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
	if kind != FaultPGRestart {
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
	kinds := append([]FaultKind(nil), FaultKinds...)
	for len(kinds) < n {
		kinds = append(kinds, FaultKinds[h.rng.IntN(len(FaultKinds))])
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
