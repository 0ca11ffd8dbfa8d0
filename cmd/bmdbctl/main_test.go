package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/cmd/worker-example/pipeline"
	"github.com/bmdb-dev/bmdb/cmd/worker-example/pipeline/pipelinedb"
	"github.com/bmdb-dev/bmdb/internal/bmdbtest"
	"github.com/bmdb-dev/bmdb/internal/testdb"
)

var binary string // the bmdbctl built for the tests

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "bmdbctl-test")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "bmdbctl")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building bmdbctl: %v\n%s", err, out)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	testdb.Main(m, bmdbtest.Migrate)
}

// ctl runs the binary with BMDB_DSN=dsn and returns stdout, stderr and the
// exit status.
func ctl(t *testing.T, dsn string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), "BMDB_DSN="+dsn)
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

// fleet is a seeded database: machine busy is claimed by a live
// "os-installer" session, machine failed is in backoff for install-os.
type fleet struct {
	dsn          string
	busy, failed uuid.UUID
	sess         *bmdb.Session
}

func seed(t *testing.T) fleet {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	f := fleet{dsn: testdb.New(t)}
	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: f.dsn, ComponentName: "os-installer", SessionInterval: 10 * time.Second,
		Application: pipeline.Application()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
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
	var backoffs []backoffRecord
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "--json", "backoffs")), &backoffs); err != nil {
		t.Fatal(err)
	}
	if len(backoffs) != 1 || backoffs[0].MachineID != f.failed || backoffs[0].SecondsLeft < 3500 || backoffs[0].IntervalSeconds != 3600 {
		t.Errorf("backoffs --json = %+v", backoffs)
	}
	var sessions []sessionRecord
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "sessions", "--json")), &sessions); err != nil || len(sessions) != 1 || sessions[0].SecondsLeft <= 0 {
		t.Errorf("sessions --json = %+v, %v", sessions, err)
	}
}

func TestMachinesAndMachine(t *testing.T) {
	f := seed(t)
	var machines []machineRecord
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "machines", "--json")), &machines); err != nil || len(machines) != 2 {
		t.Fatalf("machines --json = %+v, %v", machines, err)
	}
	if _, errOut, code := ctl(t, f.dsn, "machines", "--stage", "flying"); code != 2 || !strings.Contains(errOut, "not one of [new provided agent-started os-installed]") {
		t.Errorf("machines --stage flying: exit %d, %s", code, errOut)
	}
	out := ok(t, f.dsn, "machines", "--stage", "provided")
	if !strings.Contains(out, f.busy.String()) || strings.Contains(out, f.failed.String()) {
		t.Errorf("machines --stage provided:\n%s", out)
	}
	// Keyset pagination: the page after the first machine holds the second.
	first, second := machines[0].MachineID, machines[1].MachineID
	out = ok(t, f.dsn, "machines", "--after", first.String())
	if strings.Contains(out, first.String()) || !strings.Contains(out, second.String()) {
		t.Errorf("machines --after:\n%s", out)
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
	if started < 0 || failed < started || !strings.Contains(out, "os-installer") {
		t.Errorf("history, oldest first:\n%s", out)
	}
	if out := ok(t, f.dsn, "history", "--machine", f.failed.String(), "--process", "provide"); !strings.Contains(out, "(none)") {
		t.Errorf("history --process provide:\n%s", out)
	}
	if out := ok(t, f.dsn, "history", "--machine", f.failed.String(), "--since", "1h"); !strings.Contains(out, "Failed") {
		t.Errorf("history --since 1h:\n%s", out)
	}
	ok(t, f.dsn, "backoff", "clear", "--machine", f.failed.String(), "--process", "install-os", "--reason", "PXE fixed")
	if out := ok(t, f.dsn, "backoffs"); strings.Contains(out, f.failed.String()) {
		t.Errorf("backoff still listed after clear:\n%s", out)
	}
	var history []historyRecord
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "history", "--machine", f.failed.String(), "--json")), &history); err != nil {
		t.Fatal(err)
	}
	last := history[len(history)-1]
	if last.Event != "BackoffCleared" || last.Cause != "PXE fixed" || last.Component != "bmdbctl" {
		t.Errorf("last history event = %+v", last)
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
	info, err := bmdb.ReadSchemaInfo(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	out := ok(t, dsn, "migrate", "down", "--steps", "1", "--json")
	if !strings.Contains(out, fmt.Sprintf(`"database_version": %d,`, info.Binary-1)) {
		t.Errorf("migrate down:\n%s", out)
	}
	if out := ok(t, dsn, "migrate", "up", "--json"); !strings.Contains(out, fmt.Sprintf(`"database_version": %d,`, info.Binary)) {
		t.Errorf("migrate up:\n%s", out)
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

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	dsn := "postgres://bmdb:s3cret@127.0.0.1:1/bmdb?sslmode=disable&connect_timeout=2"
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"frobnicate"}, 2, "unknown command"},
		{[]string{"history"}, 2, "--machine is required"},
		{[]string{"history", "--machine", "12345"}, 2, "not a machine id"},
		{[]string{"machine", "not-a-uuid"}, 2, "not a machine id"},
		{[]string{"machines", "--after", "x"}, 2, "not a machine id"},
		{[]string{"work", "--limit", "0"}, 2, "--limit"},
		{[]string{"work", "--bogus"}, 2, "flag provided but not defined"},
		{[]string{"backoff", "clear", "--machine", uuid.NewString()}, 2, "--process is required"},
		{[]string{"backoff", "reset"}, 2, "clear"},
		{[]string{"migrate", "sideways"}, 2, "up, down, version, lock or unlock"},
		{[]string{"history", "prune"}, 2, "--older-than"},
		{[]string{"sessions"}, 1, "127.0.0.1:1"}, // unreachable: a failure, not a usage error
	} {
		out, errOut, code := ctl(t, dsn, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("bmdbctl %v: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, errOut, tc.code, tc.want)
		}
		if strings.Contains(out+errOut, "s3cret") {
			t.Errorf("bmdbctl %v printed the password: %s%s", tc.args, out, errOut)
		}
	}
	if _, errOut, code := ctl(t, "", "sessions"); code != 2 || !strings.Contains(errOut, "BMDB_DSN") {
		t.Errorf("no DSN: exit %d, %s", code, errOut)
	}
	if out, _, code := ctl(t, "", "help"); code != 0 || !strings.Contains(out, "history") {
		t.Errorf("help: exit %d\n%s", code, out)
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
		url = strings.TrimSpace(strings.TrimPrefix(l, "serving "))
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
	var machines []machineRecord
	if err := json.Unmarshal([]byte(ok(t, dsn, "machines", "--json")), &machines); err != nil || len(machines) != 1 || machines[0].Stage != "" {
		t.Errorf("machines --json = %+v, %v", machines, err)
	}
	if out := ok(t, dsn, "machine", id.String()); !strings.Contains(out, "machine "+id.String()+": created") {
		t.Errorf("machine:\n%s", out)
	}
	if _, errOut, code := ctl(t, dsn, "machines", "--stage", "new"); code != 2 || !strings.Contains(errOut, "defines no stages") {
		t.Errorf("machines --stage without stages: exit %d, %s", code, errOut)
	}
}
