package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/bmdbtest"
	"github.com/bmdb-dev/bmdb/cmd/worker-example/pipeline"
	"github.com/bmdb-dev/bmdb/cmd/worker-example/pipeline/pipelinedb"
	"github.com/bmdb-dev/bmdb/fleet"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
	"github.com/bmdb-dev/bmdb/migrations"
	"github.com/bmdb-dev/bmdb/model"
	"github.com/bmdb-dev/bmdb/web"
)

var binary string // the bmdbctl built for the tests

// TestMain builds bmdbctl into a directory of its own and removes it
// after the tests (os.Exit skips deferred calls: the removal runs between
// bmdbtest.Run and os.Exit).
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "bmdbctl-test")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "bmdbctl")
	code := 1
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building bmdbctl: %v\n%s", err, out)
	} else {
		code = bmdbtest.Run(m, nil)
	}
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintf(os.Stderr, "removing the test's bmdbctl: %v\n", err)
		code = 1
	}
	os.Exit(code)
}

// The test binary leaves nothing in the temporary directory: TestMain
// removes the bmdbctl it built (an 18 MB file per run, before). It runs
// this test binary again, without tests, with TMPDIR a directory of its
// own, and looks at what is left there.
func TestMainRemovesItsBinary(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the test binary without tests: %v\n%s", err, out)
	}
	left, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		t.Errorf("left in the temporary directory: %s", e.Name())
	}
}

// ctl runs the binary with BMDB_DSN=dsn and returns stdout, stderr and the
// exit status.
func ctl(t *testing.T, dsn string, args ...string) (string, string, int) {
	t.Helper()
	return ctlEnv(t, []string{"BMDB_DSN=" + dsn}, args...)
}

// ctlEnv runs the binary with env added to the test's environment.
func ctlEnv(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if exit, ok := err.(*exec.ExitError); ok {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return stdout.String(), stderr.String(), code
}

// ok runs the binary and fails the test unless it succeeds.
func ok(t *testing.T, dsn string, args ...string) string {
	t.Helper()
	out, errOut, code := ctl(t, dsn, args...)
	if code != 0 {
		t.Fatalf("bmdbctl %v: exit %d: %s", args, code, errOut)
	}
	return out
}

// seeded is a database machine busy is claimed by a live
// "os-installer" session, machine failed is in backoff for install-os.
type seeded struct {
	dsn          string
	busy, failed uuid.UUID
	sess         *bmdb.Session
	db           *sql.DB // for the web pages
}

func seed(t *testing.T) seeded {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	f := seeded{dsn: testdb.New(t)}
	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: f.dsn, ComponentName: "os-installer", SessionInterval: 10 * time.Second,
		Application: pipeline.Application()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	f.db = conn.DB()
	f.sess, err = conn.StartSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.sess.Close(ctx) })
	if err := f.sess.Transact(ctx, func(tx *bmdb.Tx) error {
		ids, err := tx.CreateMachines(ctx, 2)
		if err != nil {
			return err
		}
		f.busy, f.failed = ids[0], ids[1]
		return pipelinedb.New(tx.DBTX()).MachineProvidedInsert(ctx, pipelinedb.MachineProvidedInsertParams{MachineID: f.busy, Provider: "dc1"})
	}); err != nil {
		t.Fatal(err)
	}
	one := func(id uuid.UUID) func(*bmdb.Tx) ([]uuid.UUID, error) {
		return func(*bmdb.Tx) ([]uuid.UUID, error) { return []uuid.UUID{id}, nil }
	}
	if _, err := f.sess.Work(ctx, "install-os", one(f.busy)); err != nil {
		t.Fatal(err)
	}
	w, err := f.sess.Work(ctx, "install-os", one(f.failed))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Fail(ctx, &bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour, Exponent: 2}, "PXE timeout"); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestSessionsWorkBackoffs(t *testing.T) {
	f := seed(t)
	out := ok(t, f.dsn, "sessions")
	if !strings.Contains(out, f.sess.ID().String()) || !strings.Contains(out, "os-installer") {
		t.Errorf("sessions:\n%s", out)
	}
	out = ok(t, f.dsn, "work", "--process", "install-os")
	if !strings.Contains(out, f.busy.String()) || strings.Contains(out, f.failed.String()) || !strings.Contains(out, "true") {
		t.Errorf("work:\n%s", out)
	}
	if out := ok(t, f.dsn, "work", "--process", "provide"); !strings.Contains(out, "(none)") {
		t.Errorf("work --process provide:\n%s", out)
	}
	out = ok(t, f.dsn, "backoffs")
	if !strings.Contains(out, f.failed.String()) || !strings.Contains(out, "PXE timeout") {
		t.Errorf("backoffs:\n%s", out)
	}
	var backoffs []model.ActiveBackoff
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "--json", "backoffs")), &backoffs); err != nil {
		t.Fatal(err)
	}
	if len(backoffs) != 1 || backoffs[0].MachineID != f.failed || backoffs[0].SecondsLeft < 3500 || backoffs[0].IntervalSeconds != 3600 {
		t.Errorf("backoffs --json = %+v", backoffs)
	}
	var sessions []model.LiveSession
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "sessions", "--json")), &sessions); err != nil || len(sessions) != 1 || sessions[0].SecondsLeft <= 0 {
		t.Errorf("sessions --json = %+v, %v", sessions, err)
	}
}

func TestMachinesAndMachine(t *testing.T) {
	f := seed(t)
	var page struct {
		Machines []fleet.MachineRow `json:"machines"`
		Next     *string            `json:"next"`
	}
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "machines", "--json")), &page); err != nil || len(page.Machines) != 2 || page.Next != nil {
		t.Fatalf("machines --json = %+v, %v; want 2 machines and no next", page, err)
	}
	machines := page.Machines
	if _, errOut, code := ctl(t, f.dsn, "machines", "--stage", "flying"); code != 2 || !strings.Contains(errOut, "not one of [new provided agent-started os-installed]") {
		t.Errorf("machines --stage flying: exit %d, %s", code, errOut)
	}
	out := ok(t, f.dsn, "machines", "--stage", "provided")
	if !strings.Contains(out, f.busy.String()) || strings.Contains(out, f.failed.String()) {
		t.Errorf("machines --stage provided:\n%s", out)
	}
	// --process: the machines with a claim of the process, as the page's
	// ?process= lists them; the failed machine's claim has ended.
	out = ok(t, f.dsn, "machines", "--process", "install-os")
	if !strings.Contains(out, f.busy.String()) || strings.Contains(out, f.failed.String()) {
		t.Errorf("machines --process install-os:\n%s", out)
	}
	if out := ok(t, f.dsn, "machines", "--process", "provide"); !strings.Contains(out, "(none)") {
		t.Errorf("machines --process provide:\n%s", out)
	}
	// Keyset pagination: the page after the first machine holds the second.
	first, second := machines[0].MachineID, machines[1].MachineID
	out = ok(t, f.dsn, "machines", "--after", first.String())
	if strings.Contains(out, first.String()) || !strings.Contains(out, second.String()) || strings.Contains(out, "more machines") {
		t.Errorf("machines --after:\n%s", out)
	}
	// A full page says how to get the next one, in the table and in JSON;
	// following it reaches the last page, which says nothing more.
	out = ok(t, f.dsn, "machines", "--limit", "1")
	if want := "(more machines: bmdbctl machines --after " + first.String() + " --limit 1)"; !strings.Contains(out, want) || strings.Contains(out, second.String()) {
		t.Errorf("machines --limit 1 lacks %q:\n%s", want, out)
	}
	page.Next = nil
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "machines", "--limit", "1", "--json")), &page); err != nil || len(page.Machines) != 1 || page.Next == nil || *page.Next != first.String() {
		t.Errorf("machines --limit 1 --json = %+v, %v; want next %s", page, err, first)
	}
	page.Next = nil
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "machines", "--limit", "1", "--after", first.String(), "--json")), &page); err != nil || len(page.Machines) != 1 || page.Machines[0].MachineID != second || page.Next != nil {
		t.Errorf("the last page = %+v, %v; want %s and no next", page, err, second)
	}
	// The next page's command keeps the filter.
	if _, err := f.sess.WorkMany(context.Background(), "audit", 2, func(*bmdb.Tx) ([]uuid.UUID, error) { return []uuid.UUID{first, second}, nil }); err != nil {
		t.Fatal(err)
	}
	if out, want := ok(t, f.dsn, "machines", "--process", "audit", "--limit", "1"), "(more machines: bmdbctl machines --after "+first.String()+" --process audit --limit 1)"; !strings.Contains(out, want) {
		t.Errorf("machines --process audit --limit 1 lacks %q:\n%s", want, out)
	}
	// One call answers what the machine is doing, who holds it, since when.
	out = ok(t, f.dsn, "machine", f.busy.String())
	for _, want := range []string{"stage provided", "install-os", "os-installer", f.sess.ID().String(), "Started"} {
		if !strings.Contains(out, want) {
			t.Errorf("machine output lacks %q:\n%s", want, out)
		}
	}
	out = ok(t, f.dsn, "machine", f.failed.String())
	if !strings.Contains(out, "PXE timeout") || !strings.Contains(out, "Failed") {
		t.Errorf("machine (failed):\n%s", out)
	}
	if _, errOut, code := ctl(t, f.dsn, "machine", uuid.NewString()); code != 1 || !strings.Contains(errOut, "no machine") {
		t.Errorf("machine of an unknown id: exit %d, %s", code, errOut)
	}
}

func TestHistoryAndBackoffClear(t *testing.T) {
	f := seed(t)
	out := ok(t, f.dsn, "history", "--machine", f.failed.String())
	started, failed := strings.Index(out, "Started"), strings.Index(out, "Failed")
	if failed < 0 || started < failed || !strings.Contains(out, "os-installer") {
		t.Errorf("history, newest first:\n%s", out)
	}
	if out := ok(t, f.dsn, "history", "--machine", f.failed.String(), "--process", "provide"); !strings.Contains(out, "(none)") {
		t.Errorf("history --process provide:\n%s", out)
	}
	if out := ok(t, f.dsn, "history", "--machine", f.failed.String(), "--since", "1h"); !strings.Contains(out, "Failed") {
		t.Errorf("history --since 1h:\n%s", out)
	}
	// Without --machine, the fleet's events, newest first, with the
	// machine of each.
	var fleet []model.ReadableHistory
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "history", "--json")), &fleet); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range fleet {
		got = append(got, h.MachineID.String()+" "+h.Event)
	}
	if want := []string{f.failed.String() + " Failed", f.failed.String() + " Started", f.busy.String() + " Started"}; !slices.Equal(got, want) {
		t.Errorf("history (fleet) = %q, want %q", got, want)
	}
	out = ok(t, f.dsn, "history", "--process", "install-os", "--limit", "2")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || !strings.HasPrefix(lines[0], "AT ") || !strings.Contains(lines[0], "MACHINE") ||
		!strings.Contains(lines[1], f.failed.String()) {
		t.Errorf("history --process install-os --limit 2: a header and the 2 newest events with their machines, got:\n%s", out)
	}
	if out := ok(t, f.dsn, "history", "--process", "provide"); !strings.Contains(out, "(none)") {
		t.Errorf("history --process provide (fleet):\n%s", out)
	}
	ok(t, f.dsn, "backoff", "clear", "--machine", f.failed.String(), "--process", "install-os", "--reason", "PXE fixed")
	if out := ok(t, f.dsn, "backoffs"); strings.Contains(out, f.failed.String()) {
		t.Errorf("backoff still listed after clear:\n%s", out)
	}
	var history []model.ReadableHistory
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "history", "--machine", f.failed.String(), "--json")), &history); err != nil {
		t.Fatal(err)
	}
	if last := history[0]; last.Event != "BackoffCleared" || last.Cause != "PXE fixed" || last.ComponentName != "bmdbctl" {
		t.Errorf("newest history event = %+v", last)
	}
	if _, errOut, code := ctl(t, f.dsn, "backoff", "clear", "--machine", f.failed.String(), "--process", "install-os"); code != 1 || !strings.Contains(errOut, "no backoff") {
		t.Errorf("clearing twice: exit %d, %s", code, errOut)
	}
	// Prune: nothing is older than an hour; everything is older than a few
	// milliseconds.
	var pruned []struct{ Deleted int64 }
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "history", "prune", "--older-than", "1h", "--json")), &pruned); err != nil || len(pruned) != 1 || pruned[0].Deleted != 0 {
		t.Errorf("prune 1h = %+v, %v; want nothing deleted", pruned, err)
	}
	// Every event is older than a nanosecond by the time bmdbctl runs.
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "history", "prune", "--older-than", "1ns", "--batch", "2", "--json")), &pruned); err != nil || len(pruned) != 1 || pruned[0].Deleted != int64(len(history)+1) {
		t.Errorf("prune 1ns = %+v, %v (history had %d rows of one machine, +1 of the busy one)", pruned, err, len(history))
	}
}

func TestMigrateAndGC(t *testing.T) {
	t.Parallel()
	dsn := testdb.NewEmpty(t)
	if out := ok(t, dsn, "migrate", "version"); !strings.Contains(out, "0 ") {
		t.Errorf("version of an empty database:\n%s", out)
	}
	if _, errOut, code := ctl(t, dsn, "sessions"); code != 1 || !strings.Contains(errOut, "older than this binary") {
		t.Errorf("sessions on an unmigrated database: exit %d, %s", code, errOut)
	}
	ok(t, dsn, "migrate", "up")
	latest := bmdbLatest(t, dsn)
	out := ok(t, dsn, "migrate", "down", "--steps", "1", "--json")
	if !strings.Contains(out, fmt.Sprintf(`"database_version": %d,`, latest-1)) {
		t.Errorf("migrate down:\n%s", out)
	}
	if out := ok(t, dsn, "migrate", "up", "--json"); !strings.Contains(out, fmt.Sprintf(`"database_version": %d,`, latest)) {
		t.Errorf("migrate up:\n%s", out)
	}
	// An application's schema, migrated by its own binary, is listed too,
	// without a binary version (bmdbctl does not embed its migrations).
	app, err := migrations.NewApplication("burnin", fstest.MapFS{
		"m/000001_t.up.sql": {Data: []byte("CREATE TABLE t (x INT8);")}, "m/000001_t.down.sql": {Data: []byte("DROP TABLE t;")},
		"m/000002_u.up.sql": {Data: []byte("CREATE TABLE u (x INT8);")}, "m/000002_u.down.sql": {Data: []byte("DROP TABLE u;")},
	}, "m")
	if err != nil {
		t.Fatal(err)
	}
	appConn, err := bmdb.Open(context.Background(), bmdb.Config{DSN: dsn, ComponentName: "burner", Application: app})
	if err != nil {
		t.Fatal(err)
	}
	appConn.Close()
	out = ok(t, dsn, "migrate", "version")
	if !regexp.MustCompile(`(?m)^bmdb +schema_migrations +\d+ +\d+ +false *$`).MatchString(out) || !regexp.MustCompile(`(?m)^burnin +burnin_schema_migrations +2 +- +false *$`).MatchString(out) {
		t.Errorf("migrate version lacks bmdb's or the application's version:\n%s", out)
	}
	if out := ok(t, dsn, "migrate", "version", "--json"); !strings.Contains(out, `"schema": "burnin",
    "database_version": 2,
    "dirty": false`) {
		t.Errorf("migrate version --json:\n%s", out)
	}
	// The migration lock: none, then one left by a migrator that died, which
	// unlock clears.
	if out := ok(t, dsn, "migrate", "lock"); !strings.Contains(out, "(none)") {
		t.Errorf("migrate lock with no migrator:\n%s", out)
	}
	raw, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Exec(`INSERT INTO bmdb_migration_lock VALUES (1, gen_random_uuid(), 'dead migrator', now(), now() + INTERVAL '1 hour')`); err != nil {
		t.Fatal(err)
	}
	if out := ok(t, dsn, "migrate", "lock", "--json"); !strings.Contains(out, `"holder_info": "dead migrator"`) || !strings.Contains(out, `"live": true`) {
		t.Errorf("migrate lock:\n%s", out)
	}
	if out := ok(t, dsn, "migrate", "unlock", "--json"); !strings.Contains(out, `"cleared": true`) {
		t.Errorf("migrate unlock:\n%s", out)
	}
	if out := ok(t, dsn, "migrate", "lock"); !strings.Contains(out, "(none)") {
		t.Errorf("migrate lock after unlock:\n%s", out)
	}
	// gc deletes a session expired long ago.
	ctx := context.Background()
	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: "dead"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sess, err := conn.StartSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(ctx)
	if _, err := conn.DB().Exec("UPDATE sessions SET deadline = now() - INTERVAL '1 hour' WHERE session_id = $1", sess.ID()); err != nil {
		t.Fatal(err)
	}
	if out := ok(t, dsn, "gc", "--json"); !strings.Contains(out, `"sessions_deleted": 1`) {
		t.Errorf("gc:\n%s", out)
	}
}

// Usage errors exit 2 with a message on stderr naming what was wrong, as
// the command line spells it; nothing on stdout, no panic, no password.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	dsn := "postgres://bmdb:s3cret@127.0.0.1:1/bmdb?sslmode=disable&connect_timeout=2"
	id := uuid.NewString()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "no command given"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"history", "--machine", "12345"}, 2, "is not a UUID"},
		{[]string{"history", "--machine", id, "extra"}, 2, "takes no arguments"},
		{[]string{"history", "prune", "extra", "--older-than", "1h"}, 2, "history prune takes no arguments"},
		{[]string{"machine"}, 2, "one machine id, got 0 arguments"},
		{[]string{"machine", id, id}, 2, "one machine id, got 2 arguments"},
		{[]string{"machine", ""}, 2, "machine id is required"},
		{[]string{"machine", "not-a-uuid"}, 2, "is not a UUID"},
		{[]string{"machines", "--after", "x"}, 2, "--after \"x\" is not a UUID"},
		{[]string{"machines", "--process", "burn in"}, 2, `--process "burn in": process name "burn in" has white space`},
		{[]string{"history", "--process", "burn in"}, 2, `--process "burn in": process name "burn in" has white space`},
		{[]string{"work", "--limit", "0"}, 2, "--limit is 0, must be in [1, 100000]"},
		{[]string{"work", "--limit", "x"}, 2, `invalid value "x" for flag --limit: want an integer`},
		{[]string{"--json=maybe", "work"}, 2, `invalid boolean value "maybe" for --json: want true or false`},
		{[]string{"work", "--bogus"}, 2, "flag provided but not defined: --bogus"},
		{[]string{"work", "--process"}, 2, "flag needs an argument: --process"},
		{[]string{"work", "--process", strings.Repeat("p", 200)}, 2, "--process \"ppp"},
		{[]string{"backoffs", "--process", "\xff"}, 2, "not valid UTF-8"},
		{[]string{"work", "--process", "a\nb"}, 2, "has a control character"},
		{[]string{"backoff", "clear", "--machine", id, "--process", "burn in"}, 2, "has white space"},
		{[]string{"backoff", "clear", "--machine", id}, 2, "--process is required"},
		{[]string{"backoff", "reset"}, 2, "clear"},
		{[]string{"migrate", "sideways"}, 2, "up, down, version, force VERSION, lock or unlock"},
		{[]string{"migrate", "down", "--steps", "0"}, 2, "--steps is 0, must be positive"},
		{[]string{"migrate", "force"}, 2, "migrate force takes one VERSION, got 0 arguments"},
		{[]string{"migrate", "force", "two"}, 2, `VERSION "two" is not a version number`},
		{[]string{"migrate", "force", "-1"}, 2, `VERSION "-1" is not a version number`},
		{[]string{"migrate", "force", "999"}, 2, "version 999 is not one of the migrations of bmdb's schema: want 0 (none applied) or one of 1-"},
		{[]string{"migrate", "up", "--app", "racks"}, 2, "migrate up --app racks needs --migrations DIR"},
		{[]string{"migrate", "version", "--migrations", "."}, 2, "--migrations needs --app"},
		{[]string{"migrate", "lock", "--app", "racks"}, 2, "migrate lock takes no --app or --migrations"},
		{[]string{"migrate", "up", "--app", "racks", "--migrations", "/nonexistent"}, 2, `--migrations "/nonexistent" is not a directory`},
		{[]string{"migrate", "version", "extra"}, 2, `migrate version takes no arguments, got ["extra"]`},
		{[]string{"history", "prune"}, 2, "--older-than"},
		{[]string{"history", "prune", "--older-than", "1h", "--batch", "0"}, 2, "--batch is 0"},
		// Durations: the error names the flag and the expected format.
		{[]string{"history", "--machine", id, "--since", "5"}, 2, `invalid value "5" for flag --since: want a duration such as 90s`},
		{[]string{"history", "prune", "--older-than", "30d"}, 2, `for flag --older-than: want a duration such as 90s, 15m or 720h`},
		{[]string{"--timeout", "10", "sessions"}, 2, `for flag --timeout: want a duration`},
		{[]string{"sessions", "--timeout", "-1s"}, 2, "--timeout is -1s, must be positive"},
		{[]string{"history", "--machine", id, "--since", "-1h"}, 2, "--since is -1h0m0s, must not be negative"},
		{[]string{"help", "nope"}, 2, `unknown command "nope"`},
		{[]string{"help", "gc", "sessions"}, 2, "help takes one command"},
		{[]string{"sessions"}, 1, "127.0.0.1:1"}, // unreachable: a failure, not a usage error
	} {
		out, errOut, code := ctl(t, dsn, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("bmdbctl %q: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, errOut, tc.code, tc.want)
		}
		if code == 2 && out != "" {
			t.Errorf("bmdbctl %q: usage error with stdout %q", tc.args, out)
		}
		if strings.Contains(out+errOut, "s3cret") || strings.Contains(errOut, "panic") {
			t.Errorf("bmdbctl %q printed the password or panicked: %s%s", tc.args, out, errOut)
		}
	}
	if _, errOut, code := ctl(t, "", "sessions"); code != 2 || !strings.Contains(errOut, "pass --dsn or set $BMDB_DSN") {
		t.Errorf("no DSN: exit %d, %s", code, errOut)
	}
}

// A malformed DSN is reported as the --dsn flag or $BMDB_DSN, whichever
// held it, not as bmdb's Config.DSN, and without its password.
func TestMalformedDSN(t *testing.T) {
	t.Parallel()
	bad := "postgres://bmdb:s3cret@127.0.0.1:port/bmdb"
	for _, tc := range []struct {
		env  string
		args []string
	}{
		{bad, []string{"sessions"}},
		{"", []string{"--dsn", bad, "machines"}},
		{"", []string{"migrate", "version", "--dsn", bad}},
		{bad, []string{"history", "prune", "--older-than", "1h"}},
	} {
		out, errOut, code := ctl(t, tc.env, tc.args...)
		if code != 2 || out != "" || !strings.Contains(errOut, "--dsn (or $BMDB_DSN) is malformed") {
			t.Errorf("bmdbctl %q with BMDB_DSN=%q: exit %d, stdout %q, stderr %q; want exit 2 naming --dsn", tc.args, tc.env, code, out, errOut)
		}
		if strings.Contains(errOut, "Config.") || strings.Contains(errOut, "s3cret") {
			t.Errorf("bmdbctl %q: stderr %q names a library field or the password", tc.args, errOut)
		}
	}
}

// flagLine returns the line of help that describes flag (such as
// "--limit"), "" if there is none.
func flagLine(help, flag string) string {
	for _, l := range strings.Split(help, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == flag {
			return l
		}
	}
	return ""
}

// Help in each of its forms goes to stdout with exit status 0, needs no
// database and never shows $BMDB_DSN.
func TestHelp(t *testing.T) {
	t.Parallel()
	dsn := "postgres://bmdb:s3cret@127.0.0.1:1/bmdb"
	var usage string
	for _, args := range [][]string{{"-h"}, {"--help"}, {"-help"}, {"help"}, {"--json", "-h"}} {
		out, errOut, code := ctl(t, dsn, args...)
		if code != 0 || errOut != "" || !strings.HasPrefix(out, "usage: bmdbctl ") {
			t.Errorf("bmdbctl %q: exit %d, stderr %q, stdout:\n%s", args, code, errOut, out)
		}
		if usage != "" && out != usage {
			t.Errorf("bmdbctl %q differs from the other forms of help:\n%s", args, out)
		}
		usage = out
	}
	for _, c := range commands {
		if !strings.Contains(usage, "\n  "+c.name+" ") {
			t.Errorf("usage lacks command %s:\n%s", c.name, usage)
		}
	}
	if l := flagLine(usage, "--timeout"); !strings.Contains(l, "duration") || !strings.HasSuffix(l, "(default 30s)") {
		t.Errorf("usage: --timeout line %q", l)
	}
	for _, c := range commands {
		want, errOut, code := ctl(t, dsn, "help", c.name)
		if code != 0 || errOut != "" || !strings.HasPrefix(want, "usage: bmdbctl "+c.name) {
			t.Errorf("bmdbctl help %s: exit %d, stderr %q, stdout:\n%s", c.name, code, errOut, want)
		}
		for _, f := range []string{"--dsn", "--json", "--timeout"} {
			if flagLine(want, f) == "" {
				t.Errorf("bmdbctl help %s lacks %s:\n%s", c.name, f, want)
			}
		}
		for _, args := range [][]string{{c.name, "-h"}, {c.name, "--help"}, {c.name, "extra", "--json", "-h"}} {
			if out, errOut, code := ctl(t, dsn, args...); code != 0 || errOut != "" || out != want {
				t.Errorf("bmdbctl %q: exit %d, stderr %q, stdout:\n%s\nwant the output of help %s:\n%s", args, code, errOut, out, c.name, want)
			}
		}
		if strings.Contains(want, "s3cret") {
			t.Errorf("help %s shows $BMDB_DSN:\n%s", c.name, want)
		}
	}
	// Each command's own flags, with their types and defaults.
	for _, tc := range []struct{ cmd, flag, want string }{
		{"history", "--machine", "only this machine's events (default: the whole fleet's)"},
		{"machines", "--process", "only machines with a claim of this process"},
		{"history", "--since", "--since duration"},
		{"history", "--limit", "(default 100)"},
		{"history", "--older-than", "--older-than duration"},
		{"history", "--batch", fmt.Sprintf("(default %d)", bmdb.PruneHistoryBatchDefault)},
		{"machine", "--limit", "(default 20)"},
		{"machines", "--limit", "(default 100)"},
		{"machines", "--stage", "--stage string"},
		{"migrate", "--steps", "(default 1)"},
		{"work", "--limit", "(default 1000)"},
		{"backoffs", "--process", "--process string"},
		{"serve", "--addr", "(default 127.0.0.1:8080)"},
		{"gc", "--json", "print JSON instead of a table"},
	} {
		out := ok(t, dsn, "help", tc.cmd)
		if l := flagLine(out, tc.flag); !strings.Contains(l, tc.want) {
			t.Errorf("help %s: %s line %q lacks %q", tc.cmd, tc.flag, l, tc.want)
		}
	}
	// A common flag before the command is the default its help shows.
	if l := flagLine(ok(t, dsn, "--timeout", "5s", "gc", "-h"), "--timeout"); !strings.HasSuffix(l, "(default 5s)") {
		t.Errorf("--timeout 5s gc -h: %q", l)
	}
}

// header returns the first line after the line heading in out, split in
// columns.
func header(t *testing.T, out, heading string) []string {
	t.Helper()
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if l == heading && i+1 < len(lines) {
			return strings.Fields(lines[i+1])
		}
	}
	t.Fatalf("no %q in:\n%s", heading, out)
	return nil
}

// checkColumns fails unless cols has no column twice, nor MACHINE if
// perMachine (the machine is the same on every row).
func checkColumns(t *testing.T, what string, cols []string, perMachine bool) {
	t.Helper()
	seen := map[string]bool{}
	for _, c := range cols {
		if seen[c] || (perMachine && c == "MACHINE") {
			t.Errorf("%s: columns %v repeat %s", what, cols, c)
		}
		seen[c] = true
	}
}

// Tables repeat no column; those of one machine have no machine column.
// History is newest first in the tables too.
func TestColumns(t *testing.T) {
	f := seed(t)
	out := ok(t, f.dsn, "machine", f.failed.String())
	checkColumns(t, "machine: claims", header(t, out, "claims:"), true)
	checkColumns(t, "machine: backoffs", header(t, out, "backoffs in force:"), true)
	checkColumns(t, "machine: history", header(t, out, "recent history, newest first:"), true)
	if failed, started := strings.Index(out, "Failed"), strings.Index(out, "Started"); failed < 0 || started < failed {
		t.Errorf("machine: history not newest first:\n%s", out)
	}
	out = ok(t, f.dsn, "history", "--machine", f.failed.String())
	checkColumns(t, "history", strings.Fields(strings.SplitN(out, "\n", 2)[0]), true)
	out = ok(t, f.dsn, "history")
	checkColumns(t, "history (fleet)", strings.Fields(strings.SplitN(out, "\n", 2)[0]), false)
	for _, cmd := range []string{"sessions", "work", "backoffs", "machines"} {
		out := ok(t, f.dsn, cmd)
		checkColumns(t, cmd, strings.Fields(strings.SplitN(out, "\n", 2)[0]), false)
	}
}

// webJSON returns the JSON object of a web page.
func webJSON(t *testing.T, srv *httptest.Server, path string) map[string]json.RawMessage {
	t.Helper()
	resp, err := http.Get(srv.URL + path + "?format=json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var page map[string]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d, %v", path, resp.StatusCode, err)
	}
	return page
}

// object decodes raw as one JSON object.
func object(t *testing.T, what string, raw []byte) map[string]json.RawMessage {
	t.Helper()
	var o map[string]json.RawMessage
	if err := json.Unmarshal(raw, &o); err != nil {
		t.Fatalf("%s is not one JSON object: %v\n%s", what, err, raw)
	}
	return o
}

// first decodes the first object of the JSON array raw.
func first(t *testing.T, what string, raw []byte) map[string]json.RawMessage {
	t.Helper()
	var a []json.RawMessage
	if err := json.Unmarshal(raw, &a); err != nil || len(a) == 0 {
		t.Fatalf("%s is not a non-empty JSON array: %v\n%s", what, err, raw)
	}
	return object(t, what+"[0]", a[0])
}

// keys returns the keys of o, sorted, but those in except.
func keys(o map[string]json.RawMessage, except ...string) []string {
	var k []string
	for key := range o {
		if !slices.Contains(except, key) {
			k = append(k, key)
		}
	}
	slices.Sort(k)
	return k
}

// historyIDs returns the ids of the history records in raw, in order.
func historyIDs(t *testing.T, raw []byte) []int64 {
	t.Helper()
	var h []model.ReadableHistory
	if err := json.Unmarshal(raw, &h); err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for _, r := range h {
		ids = append(ids, r.ID)
	}
	return ids
}

// --json has the field names of the web pages' JSON; machine ID --json is
// one object; history comes in the same order (newest first) from both.
func TestJSONMatchesWeb(t *testing.T) {
	f := seed(t)
	srv := httptest.NewServer(web.New(f.db, web.Options{}))
	defer srv.Close()
	cli := func(args ...string) []byte { return []byte(ok(t, f.dsn, append(args, "--json")...)) }

	for _, id := range []uuid.UUID{f.busy, f.failed} {
		m := object(t, "machine --json", cli("machine", id.String()))
		page := webJSON(t, srv, "/machine/"+id.String())
		if got := keys(m); !slices.Equal(got, []string{"backoffs", "history", "status", "work"}) {
			t.Errorf("machine --json keys %v", got)
		}
		if got, want := keys(object(t, "status", m["status"])), keys(object(t, "web status", page["status"])); !slices.Equal(got, want) {
			t.Errorf("machine --json status keys %v, web's %v", got, want)
		}
		if got, want := keys(first(t, "history", m["history"])), keys(first(t, "web history", page["history"])); !slices.Equal(got, want) || !slices.Contains(got, "component_name") {
			t.Errorf("machine --json history keys %v, web's %v", got, want)
		}
		if got, want := historyIDs(t, m["history"]), historyIDs(t, page["history"]); !slices.Equal(got, want) || len(got) < 1 {
			t.Errorf("machine --json history ids %v, web's %v", got, want)
		}
		if got, want := historyIDs(t, cli("history", "--machine", id.String())), historyIDs(t, page["history"]); !slices.Equal(got, want) {
			t.Errorf("history --json ids %v, web's %v", got, want)
		}
	}
	busy := object(t, "machine --json", cli("machine", f.busy.String()))
	busyPage := webJSON(t, srv, "/machine/"+f.busy.String())
	work, webWork := keys(first(t, "work", busy["work"])), keys(first(t, "web work", busyPage["work"]))
	if !slices.Equal(work, webWork) || !slices.Contains(work, "component_name") {
		t.Errorf("machine --json work keys %v, web's %v", work, webWork)
	}
	if got := keys(first(t, "work --json", cli("work"))); !slices.Equal(got, webWork) {
		t.Errorf("work --json keys %v, web's %v", got, webWork)
	}
	// Backoffs: those in force, so without the web's "active", with
	// seconds_left.
	failed := object(t, "machine --json", cli("machine", f.failed.String()))
	backoffs := keys(first(t, "backoffs", failed["backoffs"]))
	webBackoffs := keys(first(t, "web backoffs", webJSON(t, srv, "/machine/"+f.failed.String())["backoffs"]), "active")
	for _, k := range webBackoffs {
		if !slices.Contains(backoffs, k) {
			t.Errorf("machine --json backoffs keys %v lack the web's %q", backoffs, k)
		}
	}
	if got := keys(first(t, "backoffs --json", cli("backoffs"))); !slices.Equal(got, backoffs) {
		t.Errorf("backoffs --json keys %v, machine --json's %v", got, backoffs)
	}
	sessions, webSessions := keys(first(t, "sessions --json", cli("sessions"))), keys(first(t, "web sessions", webJSON(t, srv, "/")["sessions"]))
	if !slices.Equal(sessions, webSessions) || !slices.Contains(sessions, "component_name") {
		t.Errorf("sessions --json keys %v, web's %v", sessions, webSessions)
	}
	machines, webMachines := keys(first(t, "machines --json", object(t, "machines --json", cli("machines"))["machines"])), keys(first(t, "web machines", webJSON(t, srv, "/machines")["machines"]))
	if !slices.Equal(machines, webMachines) || !slices.Contains(machines, "machine_created_at") {
		t.Errorf("machines --json keys %v, web's %v", machines, webMachines)
	}
}

func TestServe(t *testing.T) {
	f := seed(t)
	cmd := exec.Command(binary, "serve", "--addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "BMDB_DSN="+f.dsn)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line := make(chan string, 1)
	go func() {
		buf := make([]byte, 256)
		n, _ := stdout.Read(buf)
		line <- string(buf[:n])
	}()
	var url string
	select {
	case l := <-line:
		if fields := strings.Fields(l); len(fields) >= 3 && fields[0] == "serving" && fields[2] == "read-only" {
			url = fields[1]
		} else {
			t.Fatalf("serve printed %q, want serving URL read-only", l)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve printed no address")
	}
	resp, err := http.Get(url + "machine/" + f.failed.String())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "PXE timeout") {
		t.Errorf("GET machine page: %d\n%s", resp.StatusCode, body)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("serve after SIGINT: %v", err)
	}
}

// Without an application's stage views, machines and machine show bmdb's
// generic columns, and --stage says why it cannot filter.
func TestMachinesWithoutStages(t *testing.T) {
	t.Parallel()
	dsn := testdb.New(t)
	ctx := context.Background()
	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sess, err := conn.StartSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(ctx)
	var id uuid.UUID
	if err := sess.Transact(ctx, func(tx *bmdb.Tx) error {
		ids, err := tx.CreateMachines(ctx, 1)
		if err == nil {
			id = ids[0]
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var page fleet.MachinePage
	if err := json.Unmarshal([]byte(ok(t, dsn, "machines", "--json")), &page); err != nil || len(page.Machines) != 1 || page.Machines[0].Stage != "" {
		t.Errorf("machines --json = %+v, %v", page, err)
	}
	if out := ok(t, dsn, "machine", id.String()); !strings.Contains(out, "machine "+id.String()+": created") {
		t.Errorf("machine:\n%s", out)
	}
	if _, errOut, code := ctl(t, dsn, "machines", "--stage", "new"); code != 2 || !strings.Contains(errOut, "defines no stages") {
		t.Errorf("machines --stage without stages: exit %d, %s", code, errOut)
	}
}
