package main

import (
	"context"
	"encoding/json"
	"errors"
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
		{[]string{"cap", "x", "0"}, "must be a number in [1, 10000]"},
		{[]string{"cap", "x", "10001"}, "must be a number in [1, 10000]"},
		{[]string{"cap", "x", "many"}, "must be a number"},
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
