package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bmdb-dev/bmdb/cmd/bmdb-chaos/internal/chaos"
)

// TestMain lets the test binary serve as the harness's worker processes:
// the harness re-executes os.Executable() with "worker" first, or with
// "planted-worker" and a plant's name (plant_test.go).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		os.Exit(workerMain(os.Args[2:], nil))
	}
	if len(os.Args) > 2 && os.Args[1] == plantedWorker {
		os.Exit(workerMain(os.Args[3:], plants[os.Args[2]].wrap))
	}
	os.Exit(m.Run())
}

// runChaos runs the harness with cfg on a throwaway cluster of its own (it
// restarts PostgreSQL, so it cannot use BMDB_TEST_DSN's server), its
// workers being this test binary with worker args argv, and returns the
// report and its printout. The worker logs are kept if t fails.
func runChaos(t *testing.T, cfg chaos.Config, argv ...string) (*chaos.Report, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("the chaos harness takes about a minute; skipped with -short")
	}
	if chaos.PostgresBinDir() == "" {
		t.Skip("no PostgreSQL binaries in /usr/lib/postgresql/*/bin: the chaos harness starts and restarts its own cluster (apt-get install postgresql)")
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Repo, err = chaos.FindRepo(wd); err != nil {
		t.Fatal(err)
	}
	if cfg.LogDir, err = os.MkdirTemp("", "bmdb-chaos-logs."); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			os.RemoveAll(cfg.LogDir)
		}
	})
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg.WorkerCommand = append([]string{exe}, argv...)
	var out strings.Builder
	cfg.Out = &out
	report, err := chaos.Run(context.Background(), cfg)
	if report != nil {
		report.Print(&out)
	}
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("harness failed: %v (worker logs in %s)", err, cfg.LogDir)
	}
	return report, out.String()
}

// TestChaosCI runs the harness's CI mode.
func TestChaosCI(t *testing.T) {
	report, _ := runChaos(t, chaos.CIConfig(), "worker")
	if !report.OK() {
		t.Fatalf("%d violations (worker logs kept in %s)", len(report.Violations), report.LogDir)
	}
}

// The worker flags survive the round trip from harness to worker process.
func TestWorkerArgs(t *testing.T) {
	want := chaos.WorkerConfig{DSN: "postgres://x", ID: 3, Seed: 7, Interval: 1e9, GCPeriod: 2e9, Concurrency: 2, Connections: 2,
		WorkMin: 1e8, WorkMax: 2e8, Serializable: true, MaxClockOffset: 5e8, History: filepath.Join("logs", "worker-3.history")}
	got, err := chaos.ParseWorkerFlags(want.Args())
	if err != nil || strings.Join(got.Args(), " ") != strings.Join(want.Args(), " ") {
		t.Fatalf("ParseWorkerFlags(Args()) = %+v, %v; want %+v", got, err, want)
	}
}
