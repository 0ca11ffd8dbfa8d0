package main

import (
	"context"
	"fmt"
	"os"

	"github.com/bmdb-dev/bmdb/bmdb"
)

// runCap measures what a fleet-wide cap costs (issue 26): worker.Loop with
// N handlers on one Connection, as loopOnce runs it, three ways in each
// round: N handlers without a cap, N handlers under a cap of N/2 (never
// more than N/2 claims live), and N/2 handlers without a cap, which hold
// as many claims as the capped run may. capped / (N/2 uncapped) is the
// cost of the mechanism (the controls' read, the slots' lock, the unique
// key); capped / (N uncapped) what the cap's limit costs on top.
func runCap(ctx context.Context, cfg config, dsn string, conn *bmdb.Connection) error {
	fmt.Printf("\n== Cap: worker.Loop, one Connection, M=%d, no cap vs a cap of N/2, %d rounds ==\n", cfg.machines, cfg.rounds)
	sess, err := conn.StartSession(ctx)
	if err != nil {
		return err
	}
	defer sess.Close(context.WithoutCancel(ctx))
	setCap := func(n int) error {
		_, err := sess.CapProcess(ctx, "bench", n, bmdb.ControlChange{Reason: "bench"})
		return err
	}
	type key struct {
		n, handlers int
		capped      bool
	}
	runs := map[key][]result{}
	var order []key
	for _, n := range cfg.workers {
		if n < 2 {
			continue
		}
		order = append(order, key{n, n, false}, key{n, n, true}, key{n, n / 2, false})
	}
	for round := 1; round <= cfg.rounds; round++ {
		for _, k := range order {
			capN := 0
			if k.capped {
				capN = k.n / 2
			}
			if err := setCap(capN); err != nil {
				return fmt.Errorf("cap %d: %w", capN, err)
			}
			r, _, err := loopOnce(ctx, dsn, cfg.machines, k.handlers, 1, false)
			if err != nil {
				return fmt.Errorf("cap run %+v: %w", k, err)
			}
			runs[k] = append(runs[k], r)
			fmt.Printf("cap round %d N=%d handlers=%d capped=%v: %.0f/s\n", round, k.n, k.handlers, k.capped, r.rate())
		}
	}
	if err := setCap(0); err != nil {
		return err
	}
	t := newTable(os.Stdout, "N", "no cap, N handlers/s", "cap N/2, N handlers/s", "no cap, N/2 handlers/s",
		"capped / N/2 uncapped", "capped / N uncapped", "retries/item capped")
	for _, n := range cfg.workers {
		if n < 2 {
			continue
		}
		full, capped, half := median(runs[key{n, n, false}]), median(runs[key{n, n, true}]), median(runs[key{n, n / 2, false}])
		t.row(fmt.Sprint(n), f0(full.rate()), f0(capped.rate()), f0(half.rate()),
			ratio(capped.rate(), half.rate()), ratio(capped.rate(), full.rate()),
			fmt.Sprintf("%.3f", float64(capped.retries)/float64(max(capped.items, 1))))
	}
	t.flush()
	return nil
}
