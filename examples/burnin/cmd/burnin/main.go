// Command burnin seeds racked machines and burns them in until none is
// left, then prints what it did:
//
//	BMDB_DSN='postgres://user@host:5432/db?sslmode=disable' go run ./cmd/burnin --seed 100
//
// Run several at once (without --seed) to share the work: each machine is
// burned in exactly once, whichever process claims it.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/worker"

	"example.com/burnin"
)

func main() {
	seed := flag.Int("seed", 0, "create this many racked machines first")
	failures := flag.Float64("failure-rate", 0.2, "fraction of burn-ins that fail (and are retried after a backoff)")
	idle := flag.Duration("stop-when-idle", 2*time.Second, "exit once there has been nothing to do for this long")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Getenv("BMDB_DSN"), *seed, *failures, *idle); err != nil {
		fmt.Fprintln(os.Stderr, "burnin:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dsn string, seed int, failures float64, idle time.Duration) error {
	if dsn == "" {
		return fmt.Errorf("BMDB_DSN is empty: set it to the database's DSN")
	}
	conn, err := burnin.Open(ctx, dsn, "burnin")
	if err != nil {
		return err
	}
	defer conn.Close()
	if seed > 0 {
		if _, err := burnin.Seed(ctx, conn, seed, "rack-1"); err != nil {
			return err
		}
	}
	burn := func(ctx context.Context, machine uuid.UUID, token int64) (time.Duration, error) {
		select { // the burn-in itself, here a short wait
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		if rand.Float64() < failures {
			return 0, fmt.Errorf("memory test failed on %s", machine)
		}
		return 90 * time.Minute, nil
	}
	loop, err := burnin.NewLoop(conn, burn, worker.Config{
		Concurrency:  8,
		Backoff:      bmdb.Backoff{Initial: 100 * time.Millisecond, Maximum: time.Second, Exponent: 2},
		StopWhenIdle: idle,
	})
	if err != nil {
		return err
	}
	if err := loop.Run(ctx); err != nil {
		return err
	}
	s := loop.Stats()
	fmt.Printf("burned in %d machines, %d failures retried\n", s.Finished, s.Failed)
	return nil
}
