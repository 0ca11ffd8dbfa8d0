package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/bmdbtest"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

func TestMain(m *testing.M) { os.Exit(bmdbtest.Run(m, nil)) }

// The pipeline takes every seeded machine through every stage exactly once,
// failures and backoff included.
func TestPipelineCompletes(t *testing.T) {
	dsn := testdb.New(t)
	o := options{
		dsn: dsn, machines: 30, concurrency: 4, workDuration: 5 * time.Millisecond,
		failureRate: 0.3, interval: time.Second, timeout: time.Minute,
		backoff: bmdb.Backoff{Initial: 20 * time.Millisecond, Maximum: 100 * time.Millisecond, Exponent: 2},
	}
	if err := run(context.Background(), o); err != nil {
		t.Fatalf("run: %v", err)
	}
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var complete, finished, failed, open int
	err = db.QueryRow(`SELECT
		(SELECT count(*) FROM machines m JOIN machine_provided USING (machine_id)
		   JOIN machine_agent_started USING (machine_id) JOIN machine_os_installed USING (machine_id)),
		(SELECT count(*) FROM work_history WHERE event = 'Finished'),
		(SELECT count(*) FROM work_history WHERE event = 'Failed'),
		(SELECT count(*) FROM work) + (SELECT count(*) FROM sessions)`).Scan(&complete, &finished, &failed, &open)
	if err != nil {
		t.Fatal(err)
	}
	if complete != 30 || finished != 90 {
		t.Errorf("%d machines complete and %d stages finished, want 30 and 90", complete, finished)
	}
	if failed == 0 {
		t.Error("no simulated failure at a 30% failure rate")
	}
	if open != 0 {
		t.Errorf("%d work or session rows left", open)
	}
	// No machine entered a stage before the previous one was done: each
	// start-agent claim was inserted after its machine's provide claim
	// finished. (History ids order the inserts; the rows' times are their
	// transactions' start times, which do not: a claim that began before
	// the finish committed can still have seen it.)
	var early int
	err = db.QueryRow(`SELECT count(*) FROM work_history h
		WHERE h.process = 'start-agent' AND h.event = 'Started' AND h.id < (
			SELECT min(f.id) FROM work_history f
			WHERE f.machine_id = h.machine_id AND f.process = 'provide' AND f.event = 'Finished')`).Scan(&early)
	if err != nil || early != 0 {
		t.Errorf("%d agent starts before the machine was provided (err %v)", early, err)
	}
}

// klog's lines go to the log file, not between the demo's own lines: the
// binary's standard output and error, read as one stream as a terminal
// shows them, hold no log line, and the file holds the migrations' lines.
func TestLogDoesNotInterleaveWithProgress(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	binary := filepath.Join(dir, "worker-example")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		t.Fatalf("building worker-example: %v\n%s", err, out)
	}
	logFile := filepath.Join(dir, "demo.log")
	cmd := exec.Command(binary, "--machines", "20", "--work-duration", "1ms", "--log-file", logFile)
	cmd.Env = append(os.Environ(), "BMDB_DSN="+testdb.New(t))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("worker-example: %v\n%s", err, out)
	}
	klogLine := regexp.MustCompile(`(?m)^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ .*$`)
	if lines := klogLine.FindAllString(string(out), -1); len(lines) > 0 {
		t.Errorf("log lines among the demo's output: %q", lines)
	}
	for _, want := range []string{"the log goes to " + logFile, "all 20 machines passed every stage"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the demo's output lacks %q:\n%s", want, out)
		}
	}
	log, err := os.ReadFile(logFile)
	if err != nil || !strings.Contains(string(log), "migrations: migrating application pipeline") {
		t.Errorf("the log file (%v) lacks the migrations' lines:\n%s", err, log)
	}
}

// --trace stdout prints the spans, one JSON object a line among the
// progress lines, all flushed by the time the command exits: the loops'
// handle spans, each linked to a batch span, and the calls' spans; a
// --trace the command does not know is refused, naming the flag.
func TestTraceFlag(t *testing.T) {
	t.Parallel()
	binary := filepath.Join(t.TempDir(), "worker-example")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		t.Fatalf("building worker-example: %v\n%s", err, out)
	}
	dsn := testdb.New(t)

	bogus := exec.Command(binary, "--trace", "bogus", "--log-file", "-")
	bogus.Env = append(os.Environ(), "BMDB_DSN="+dsn)
	out, err := bogus.CombinedOutput()
	if err == nil || !strings.Contains(string(out), `--trace is "bogus", must be stdout or none`) {
		t.Errorf("--trace bogus: %v\n%s", err, out)
	}

	cmd := exec.Command(binary, "--machines", "5", "--work-duration", "1ms", "--failure-rate", "0",
		"--trace", "stdout", "--log-file", filepath.Join(t.TempDir(), "log"))
	cmd.Env = append(os.Environ(), "BMDB_DSN="+dsn)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("worker-example --trace stdout: %v\n%s", err, stdout)
	}
	type span struct {
		Name        string
		SpanContext struct{ SpanID string }
		Links       []struct{ SpanContext struct{ SpanID string } }
	}
	names := map[string]int{}
	batches := map[string]bool{}
	var handles []span
	progress := 0
	for line := range strings.Lines(string(stdout)) {
		if !strings.HasPrefix(line, "{") {
			progress++
			continue
		}
		var s span
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("a span line that is not JSON: %v\n%s", err, line)
		}
		names[s.Name]++
		switch s.Name {
		case "bmdb.batch":
			batches[s.SpanContext.SpanID] = true
		case "worker.handle":
			handles = append(handles, s)
		}
	}
	if progress == 0 || !strings.Contains(string(stdout), "all 5 machines passed every stage") {
		t.Errorf("no progress among the spans:\n%s", stdout)
	}
	// 5 machines through 3 stages, none failing: 15 handles.
	if names["worker.handle"] != 15 || names["worker-example"] != 1 || names["bmdb.batch"] == 0 || names["worker.claim"] == 0 ||
		names["bmdb.FinishAndWork"]+names["bmdb.Finish"] != 15 {
		t.Errorf("spans printed: %v", names)
	}
	for _, h := range handles {
		linked := false
		for _, l := range h.Links {
			linked = linked || batches[l.SpanContext.SpanID]
		}
		if !linked {
			t.Errorf("a worker.handle span links to no printed batch span: %+v", h)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	good := options{dsn: "postgres://x", machines: 1, concurrency: 1, failureRate: 0.1, timeout: time.Second,
		backoff: bmdb.Backoff{Initial: time.Second, Maximum: time.Second, Exponent: 2}}
	if err := good.validate(); err != nil {
		t.Fatalf("good options: %v", err)
	}
	for name, mod := range map[string]func(*options){
		"dsn":          func(o *options) { o.dsn = "" },
		"keep-serving": func(o *options) { o.keepServing = true },
		"machines":     func(o *options) { o.machines = -1 },
		"concurrency":  func(o *options) { o.concurrency = 0 },
		"failure-rate": func(o *options) { o.failureRate = 1 },
		"timeout":      func(o *options) { o.timeout = 0 },
		"backoff":      func(o *options) { o.backoff.Initial = 0 },
		"trace":        func(o *options) { o.trace = "jaeger" },
	} {
		o := good
		mod(&o)
		if err := o.validate(); err == nil {
			t.Errorf("bad %s accepted", name)
		}
	}
}

// make demo KEEP=1 prints the DSN to paste into bmdbctl: whole (with its
// sslmode), and never with a password.
func TestPrintableDSN(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable": "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"postgres://op:s3cret@db:5432/bmdb?sslmode=verify-full":       "postgres://op:xxxxx@db:5432/bmdb?sslmode=verify-full",
		"host=127.0.0.1 port=5432 dbname=postgres sslmode=disable":    "host=127.0.0.1 port=5432 dbname=postgres sslmode=disable",
	} {
		if got := printableDSN(in); got != want {
			t.Errorf("printableDSN(%q) = %q, want %q", in, got, want)
		}
	}
}
