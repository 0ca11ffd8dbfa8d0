// Command bmdb-chaos is bmdb's fault-injection harness (see package chaos):
// it runs a fleet of worker processes against a throwaway PostgreSQL
// cluster, kills, stalls, partitions and disconnects them, restarts and
// locks the database, refuses their connections and kills or stalls their
// COMMITs, then checks the workers' recorded histories and the database's
// against a model of claims (porcupine) and plain rules: every item
// processed exactly once, no claim violated. With BMDB_TEST_COCKROACH set
// (package crdbmode) its workers run in cockroach mode.
//
//	bmdb-chaos                      # CI mode: 12 faults, a few hundred items, seed 1
//	bmdb-chaos --seed 7 --soak 30m  # soak mode: random faults for 30 minutes
//	bmdb-chaos --workers 8 --serializable --soak 10m
//
// It exits 1 on any violation. bmdb-chaos worker ... is its worker mode,
// which the harness starts itself.
package main

import (
	"context"
	"database/sql/driver"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/cmd/bmdb-chaos/internal/chaos"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		os.Exit(workerMain(os.Args[2:], nil))
	}
	os.Exit(harnessMain(os.Args[1:]))
}

// harnessMain runs the harness with command-line flags args.
func harnessMain(args []string) int {
	cfg := chaos.CIConfig()
	fs := flag.NewFlagSet("bmdb-chaos", flag.ContinueOnError)
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the fault schedule and timings")
	fs.DurationVar(&cfg.Soak, "soak", 0, "soak mode: inject random faults for this long (0: CI mode)")
	fs.IntVar(&cfg.Faults, "faults", cfg.Faults, "CI mode: number of faults (at least one of each kind)")
	fs.BoolVar(&cfg.Serializable, "serializable", false, "run the workers' batches SERIALIZABLE (bmdb.Config.SerializableBatches) instead of at snapshot isolation")
	fs.Func("kinds", "comma-separated fault kinds to inject (default: all)", func(v string) error {
		cfg.Kinds = nil
		for k := range strings.SplitSeq(v, ",") {
			if !slices.Contains(chaos.FaultKinds, chaos.FaultKind(k)) {
				return fmt.Errorf("unknown fault kind %q (want one of %v)", k, chaos.FaultKinds)
			}
			cfg.Kinds = append(cfg.Kinds, chaos.FaultKind(k))
		}
		return nil
	})
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "worker processes")
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "handlers per loop")
	fs.IntVar(&cfg.Connections, "connections", cfg.Connections, "bmdb Connections per worker process, each with a loop of its own")
	fs.IntVar(&cfg.Items, "items", cfg.Items, "items seeded at the start, and per top-up while faults run")
	fs.DurationVar(&cfg.Interval, "interval", cfg.Interval, "bmdb session interval of the workers")
	fs.DurationVar(&cfg.GCPeriod, "gc-period", cfg.GCPeriod, "bmdb GC period of the workers")
	fs.DurationVar(&cfg.WorkMin, "work-min", cfg.WorkMin, "shortest simulated work per item")
	fs.DurationVar(&cfg.WorkMax, "work-max", cfg.WorkMax, "longest simulated work per item")
	fs.DurationVar(&cfg.ReclaimSlack, "reclaim-slack", cfg.ReclaimSlack, "allowed beyond the reclaim and release bounds on an idle machine (the measured delays come on top)")
	fs.StringVar(&cfg.PGDir, "pg-dir", "", "directory of the throwaway PostgreSQL cluster (default: a new temp dir)")
	fs.BoolVar(&cfg.KeepPG, "keep-pg", false, "leave the cluster running afterwards, for inspection")
	fs.StringVar(&cfg.LogDir, "log-dir", "", "directory of the worker logs (default: a new temp dir)")
	fs.StringVar(&cfg.Repo, "repo", "", "repository root, for scripts/pg-start (default: found above the working directory)")
	fs.DurationVar(&cfg.Timeout, "timeout", 0, "bound of the whole run (default: 4m, or soak + 5m)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = chaos.CIConfig().Timeout
		if cfg.Soak > 0 {
			cfg.Timeout = cfg.Soak + 5*time.Minute
		}
	}
	if cfg.Repo == "" {
		wd, _ := os.Getwd()
		repo, err := chaos.FindRepo(wd)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bmdb-chaos:", err, "(pass --repo)")
			return 2
		}
		cfg.Repo = repo
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bmdb-chaos:", err)
		return 2
	}
	cfg.WorkerCommand = []string{exe, "worker"}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	report, err := chaos.Run(ctx, cfg)
	if report != nil {
		report.Print(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bmdb-chaos: harness failed:", err)
		return 1
	}
	if !report.OK() {
		return 1
	}
	return 0
}

// workerMain runs one worker process until SIGTERM, or until its parent
// (the harness) is gone; wrap, if not nil, wraps its connectors (the
// tests' planted bugs, WorkerConfig.Wrap).
func workerMain(args []string, wrap func(driver.Connector) driver.Connector) int {
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	_ = klogFlags.Set("v", "1")
	cfg, err := chaos.ParseWorkerFlags(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bmdb-chaos worker:", err)
		return 2
	}
	cfg.Wrap = wrap
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	parent := os.Getppid()
	go func() {
		for ctx.Err() == nil {
			if os.Getppid() != parent {
				klog.Warningf("chaos: harness gone; stopping")
				cancel()
			}
			time.Sleep(500 * time.Millisecond)
		}
	}()
	err = chaos.RunWorker(ctx, cfg)
	klog.Flush()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bmdb-chaos worker:", err)
		return 1
	}
	return 0
}
