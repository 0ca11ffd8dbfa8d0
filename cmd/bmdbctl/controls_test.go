package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/fleet"
)

// pause, resume and cap change what the fleet's claims may do, say when
// they change nothing, and processes shows each process's state and the
// changes with who and why.
func TestPauseResumeCapProcesses(t *testing.T) {
	f := seed(t)
	ctx := context.Background()
	if out := ok(t, f.dsn, "pause", "install-os", "--reason", "bad image", "--by", "alice"); !strings.Contains(out, "install-os: paused") {
		t.Errorf("pause:\n%s", out)
	}
	if out := ok(t, f.dsn, "pause", "install-os"); !strings.Contains(out, "already so, nothing changed") {
		t.Errorf("pausing twice:\n%s", out)
	}
	m := uuid.Nil
	if err := f.sess.Transact(ctx, func(tx *bmdb.Tx) error {
		ids, err := tx.CreateMachines(ctx, 1)
		m = ids[0]
		return err
	}); err != nil {
		t.Fatal(err)
	}
	one := func(*bmdb.Tx) ([]uuid.UUID, error) { return []uuid.UUID{m}, nil }
	if _, err := f.sess.Work(ctx, "install-os", one); !errors.Is(err, bmdb.ErrProcessPaused) {
		t.Fatalf("Work while paused = %v, want ErrProcessPaused", err)
	}
	out := ok(t, f.dsn, "processes")
	if !strings.Contains(out, "install-os") || !strings.Contains(out, "PAUSED") || !strings.Contains(out, "bad image") || !strings.Contains(out, "alice") {
		t.Errorf("processes while paused:\n%s", out)
	}
	ok(t, f.dsn, "resume", "install-os", "--reason", "new image")
	if out := ok(t, f.dsn, "resume", "install-os"); !strings.Contains(out, "already so") {
		t.Errorf("resuming a running process:\n%s", out)
	}
	ok(t, f.dsn, "cap", "install-os", "1", "--reason", "image servers")
	// The seeded busy machine holds the one slot's worth: at the cap.
	if _, err := f.sess.Work(ctx, "install-os", one); err == nil || !errors.Is(err, bmdb.ErrNothingToDo) {
		t.Errorf("Work at the cap = %v, want a nothing-to-do error", err)
	}
	var procs []fleet.ProcessControl
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "processes", "--json")), &procs); err != nil {
		t.Fatal(err)
	}
	var got *fleet.ProcessControl
	for i := range procs {
		if procs[i].Process == "install-os" {
			got = &procs[i]
		}
	}
	if got == nil || got.Paused || got.ClaimCap == nil || *got.ClaimCap != 1 || got.LiveClaims != 1 {
		t.Errorf("processes --json: install-os = %+v", got)
	}
	ok(t, f.dsn, "cap", "install-os", "--none")
	if w, err := f.sess.Work(ctx, "install-os", one); err != nil {
		t.Errorf("Work without a cap = %v", err)
	} else if err := w.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	var changes []fleet.ControlRecord
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "processes", "--history", "--process", "install-os", "--json")), &changes); err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, c := range changes {
		actions = append(actions, c.Action+":"+c.Reason)
	}
	if want := "uncap:|cap:image servers|resume:new image|pause:bad image"; strings.Join(actions, "|") != want {
		t.Errorf("history of changes, newest first = %q, want %q", strings.Join(actions, "|"), want)
	}
	if len(changes) == 4 && (changes[3].Actor != "alice" || !strings.Contains(changes[3].RuntimeInfo, "bmdbctl")) {
		t.Errorf("the pause's record = %+v, want by alice from bmdbctl", changes[3])
	}
}

// Bad command lines for the controls: exit status 2, the problem named.
func TestControlUsageErrors(t *testing.T) {
	f := seed(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pause"}, "needs a PROCESS"},
		{[]string{"pause", "a b"}, `PROCESS "a b"`},
		{[]string{"pause", "x", "y"}, "takes one PROCESS"},
		{[]string{"cap", "x"}, "needs PROCESS and N"},
		{[]string{"cap", "x", "0"}, `N "0": a cap is a number of live claims in [1, 10000], or --none for no cap`},
		{[]string{"cap", "x", "10001"}, `N "10001": a cap is a number of live claims in [1, 10000], or --none`},
		{[]string{"cap", "x", "many"}, `N "many": a cap is a number of live claims in [1, 10000], or --none`},
		// A negative number is N, not an undefined flag (it was "flag
		// provided but not defined: --1").
		{[]string{"cap", "burn-in", "-1"}, `N "-1": a cap is a number of live claims in [1, 10000], or --none for no cap`},
		{[]string{"cap", "burn-in", "-5", "--reason", "typo"}, `N "-5": a cap is a number`},
		{[]string{"cap", "--reason", "typo", "burn-in", "-2.5"}, `N "-2.5": a cap is a number`},
		{[]string{"pause", "x", "-1"}, `takes one PROCESS, got ["x" "-1"]`},
		{[]string{"controls"}, "controls needs the subcommand delete"},
		{[]string{"controls", "delete"}, "controls delete needs a PROCESS"},
		{[]string{"controls", "delete", "a b"}, `PROCESS "a b"`},
		{[]string{"cap", "x", "3", "--none"}, "--none takes no N"},
		{[]string{"processes", "--limit", "0"}, "--limit"},
	} {
		_, errOut, code := ctl(t, f.dsn, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("bmdbctl %v: exit %d, %q; want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
}

// serve refuses bad operator credentials before it listens, naming where
// they came from and never printing a token.
func TestServeRejectsBadOperators(t *testing.T) {
	f := seed(t)
	secret := "secret-token-0123456789"
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"serve", "--addr", "127.0.0.1:0", "--operators", "/nonexistent/ops"}, "", "--operators"},
		{[]string{"serve", "--addr", "127.0.0.1:0"}, "alice:short", "$BMDB_OPERATORS"},
		{[]string{"serve", "--addr", "127.0.0.1:0"}, "alice:" + secret + ",alice:" + secret + "x", "given twice"},
	} {
		_, errOut, code := ctlEnv(t, []string{"BMDB_DSN=" + f.dsn, "BMDB_OPERATORS=" + tc.env}, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, secret) {
			t.Errorf("bmdbctl %v with $BMDB_OPERATORS=%q: exit %d, %q; want 2 naming %q, no token", tc.args, tc.env, code, errOut, tc.want)
		}
	}
}

// ctlWithout runs the binary with BMDB_DSN=dsn and without the
// environment variable unset.
func ctlWithout(t *testing.T, dsn, unset string, args ...string) (string, string, int) {
	t.Helper()
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, unset+"=") {
			env = append(env, kv)
		}
	}
	cmd := exec.Command(binary, args...)
	cmd.Env = append(env, "BMDB_DSN="+dsn)
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

// pause, resume and cap refuse a process the database does not know (a
// typo would make controls of its own, for good), naming the known
// processes and the nearest, with exit status 2; --new controls it anyway.
func TestControlsRefuseUnknownProcess(t *testing.T) {
	f := seed(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pause", "nosuchprocess", "--reason", "typo"},
			`bmdbctl pause: process "nosuchprocess" is unknown (no claims, history, backoffs or controls yet); known processes: install-os; pass --new to pause it anyway`},
		{[]string{"resume", "install_os"}, `did you mean "install-os"? known processes: install-os; pass --new to resume it anyway`},
		{[]string{"cap", "instal-os", "3"}, `bmdbctl cap: process "instal-os" is unknown`},
		{[]string{"cap", "nosuchprocess", "--none"}, "pass --new to cap it anyway"},
	} {
		out, errOut, code := ctl(t, f.dsn, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) || out != "" {
			t.Errorf("bmdbctl %v: exit %d, %q, %q; want 2 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
	var n int
	if err := f.db.QueryRow("SELECT count(*) FROM process_controls WHERE process <> 'install-os'").Scan(&n); err != nil || n != 0 {
		t.Errorf("refused controls made %d controls rows (%v)", n, err)
	}
	if out := ok(t, f.dsn, "pause", "firmware", "--new", "--reason", "not deployed yet"); out != "firmware: paused\n" {
		t.Errorf("pause --new: %q", out)
	}
	// Known now, by its controls row.
	if out := ok(t, f.dsn, "cap", "firmware", "2"); out != "firmware: capped at 2 live claims\n" {
		t.Errorf("cap of the new process: %q", out)
	}
}

// controls delete deletes a process's controls row and its slots,
// recorded; it refuses a paused or capped process without --force, and a
// later claim makes a fresh row, running without a cap.
func TestControlsDelete(t *testing.T) {
	f := seed(t)
	ctx := context.Background()
	ok(t, f.dsn, "cap", "install-os", "2")
	ok(t, f.dsn, "pause", "install-os", "--reason", "retiring")
	_, errOut, code := ctl(t, f.dsn, "controls", "delete", "install-os")
	if want := "bmdbctl controls: install-os is paused and capped at 2 live claims: deleting its controls lifts that; pass --force to delete them anyway"; code != 2 || !strings.Contains(errOut, want) {
		t.Errorf("controls delete of a paused process: exit %d, %q; want 2 and %q", code, errOut, want)
	}
	if out := ok(t, f.dsn, "controls", "delete", "install-os", "--force", "--reason", "retired", "--by", "alice"); out != "install-os: controls deleted\n" {
		t.Errorf("controls delete --force: %q", out)
	}
	var rows, slots int
	if err := f.db.QueryRow("SELECT (SELECT count(*) FROM process_controls WHERE process = 'install-os'), (SELECT count(*) FROM process_slots WHERE process = 'install-os')").Scan(&rows, &slots); err != nil {
		t.Fatal(err)
	}
	if rows != 0 || slots != 0 {
		t.Errorf("after the delete: %d controls rows, %d slots; want none", rows, slots)
	}
	var changes []fleet.ControlRecord
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "processes", "--history", "--process", "install-os", "--json")), &changes); err != nil {
		t.Fatal(err)
	}
	if len(changes) != 3 || changes[0].Action != "delete" || changes[0].ClaimCap == nil || *changes[0].ClaimCap != 2 ||
		changes[0].Actor != "alice" || changes[0].Reason != "retired" {
		t.Errorf("history after the delete: %+v", changes)
	}
	if out := ok(t, f.dsn, "processes"); strings.Contains(out, "install-os") {
		t.Errorf("processes lists install-os after the delete:\n%s", out)
	}
	// The pause is lifted: a claim commits, and makes a fresh row.
	m := uuid.Nil
	if err := f.sess.Transact(ctx, func(tx *bmdb.Tx) error {
		ids, err := tx.CreateMachines(ctx, 1)
		m = ids[0]
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.sess.Work(ctx, "install-os", func(*bmdb.Tx) ([]uuid.UUID, error) { return []uuid.UUID{m}, nil }); err != nil {
		t.Fatalf("Work after the delete: %v", err)
	}
	var procs []fleet.ProcessControl
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "processes", "--json")), &procs); err != nil {
		t.Fatal(err)
	}
	if len(procs) != 1 || procs[0].Process != "install-os" || procs[0].Paused || procs[0].ClaimCap != nil || procs[0].LiveClaims != 2 {
		t.Errorf("processes after a claim: %+v; want install-os running without a cap", procs)
	}
	// A running process's controls go without --force; then there is
	// nothing to delete.
	if out := ok(t, f.dsn, "controls", "delete", "install-os"); out != "install-os: controls deleted\n" {
		t.Errorf("controls delete of a running process: %q", out)
	}
	if out := ok(t, f.dsn, "controls", "delete", "install-os"); out != "install-os: no controls, nothing changed\n" {
		t.Errorf("controls delete again: %q", out)
	}
	var res struct {
		Process string `json:"process"`
		Changed bool   `json:"changed"`
	}
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "controls", "delete", "install-os", "--json")), &res); err != nil || res.Process != "install-os" || res.Changed {
		t.Errorf("controls delete --json of nothing: %+v, %v", res, err)
	}
}

// The runtime recorded for bmdbctl's changes names who ran it from $USER,
// and says nothing of it without one (it said "run by " then).
func TestRuntimeWithoutUser(t *testing.T) {
	f := seed(t)
	if _, errOut, code := ctlWithout(t, f.dsn, "USER", "pause", "install-os"); code != 0 {
		t.Fatalf("pause without $USER: exit %d, %s", code, errOut)
	}
	if _, errOut, code := ctlEnv(t, []string{"BMDB_DSN=" + f.dsn, "USER=alice"}, "resume", "install-os"); code != 0 {
		t.Fatalf("resume with USER=alice: exit %d, %s", code, errOut)
	}
	var changes []fleet.ControlRecord
	if err := json.Unmarshal([]byte(ok(t, f.dsn, "processes", "--history", "--json")), &changes); err != nil || len(changes) != 2 {
		t.Fatalf("history: %+v, %v", changes, err)
	}
	resume, pause := changes[0].RuntimeInfo, changes[1].RuntimeInfo
	if !strings.Contains(pause, "bmdbctl on ") || strings.Contains(pause, "run by") || strings.HasSuffix(pause, " ") {
		t.Errorf("runtime of the pause without $USER = %q", pause)
	}
	if !strings.HasSuffix(resume, ", run by alice") || changes[0].Actor != "alice" {
		t.Errorf("runtime of the resume by alice = %q (by %q)", resume, changes[0].Actor)
	}
	out := ok(t, f.dsn, "processes", "--history")
	if strings.Contains(out, "run by \n") || strings.Contains(out, "run by  ") {
		t.Errorf("processes --history shows a dangling \"run by\":\n%s", out)
	}
}
