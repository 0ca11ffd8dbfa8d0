// Command burnin seeds racked machines and burns them in until none is
// left, then prints what it did:
//
//	BMDB_DSN='postgres://user@host:5432/db?sslmode=disable' go run ./cmd/burnin --seed 100
//
// Run several at once (without --seed) to share the work: each machine is
// burned in exactly once, whichever process claims it. It exits with
// status 0 only if no machine is left: none in backoff, none claimed by
// another copy (one that was killed holds its claims until its session
// expires; --drain waits for that, and takes them over). Otherwise it
// says how many were left and exits with status 1.
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
	idle := flag.Duration("stop-when-idle", 2*time.Second, "stop once there has been nothing to do for this long")
	drain := flag.Duration("drain", 30*time.Second, "then wait up to this long for machines in backoff or claimed by other copies (0: stop at once)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Getenv("BMDB_DSN"), *seed, *failures, *idle, *drain); err != nil {
		fmt.Fprintln(os.Stderr, "burnin:", err)
		os.Exit(1)
	}
}

// run seeds, burns in until nothing is left, and prints what it did. It
// returns the loop's *worker.LeftError if it stopped with machines in
// backoff or claimed by other copies: work that is not done.
func run(ctx context.Context, dsn string, seed int, failures float64, idle, drain time.Duration) error {
	if dsn == "" {
		return fmt.Errorf("BMDB_DSN is empty: set it to the database's DSN")
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
	cfg := burnin.LoopConfig(burn, worker.Config{
		Concurrency:  8,
		Backoff:      bmdb.Backoff{Initial: 100 * time.Millisecond, Maximum: time.Second, Exponent: 2},
		StopWhenIdle: idle,
		DrainTimeout: drain,
	})
	if err := cfg.Validate(); err != nil { // before Open touches the database
		return err
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
	loop, err := worker.New(conn, cfg)
	if err != nil {
		return err
	}
	err = loop.Run(ctx)
	s := loop.Stats()
	fmt.Printf("burned in %d machines, %d failures retried\n", s.Finished, s.Failed)
	return err
}
