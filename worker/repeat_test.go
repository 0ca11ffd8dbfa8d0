package worker

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
)

// A warning is logged once, then counted; the count is logged when
// another warning or a success replaces it, and every repeatedEvery.
func TestRepeatedWarning(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var r repeated
	for _, step := range []struct {
		msg  string // "": ok()
		at   time.Duration
		want []string
	}{
		{msg: "a", at: 0, want: []string{"a"}},
		{msg: "a", at: time.Second},
		{msg: "a", at: 2 * time.Second},
		{msg: "b", at: 3 * time.Second, want: []string{"a (repeated 2 times in 2s)", "b"}},
		{msg: "b", at: 3*time.Second + 250*time.Millisecond},
		{msg: "b", at: 33 * time.Second, want: []string{"b (repeated 2 times in 30s)"}},
		{msg: "b", at: 34 * time.Second},
		{msg: "", at: 35 * time.Second, want: []string{"b (repeated 1 times in 1s)"}},
		{msg: "", at: 36 * time.Second},
		{msg: "b", at: 37 * time.Second, want: []string{"b"}},
		{msg: "b", at: 37*time.Second + 40*time.Millisecond},
		{msg: "", at: 38 * time.Second, want: []string{"b (repeated 1 times in 40ms)"}},
	} {
		var got []string
		if step.msg == "" {
			got = r.clear()
		} else {
			got = r.note(step.msg, at(step.at))
		}
		if !slices.Equal(got, step.want) {
			t.Errorf("at %v, %q: logged %q, want %q", step.at, step.msg, got, step.want)
		}
	}
}

// A loop whose claims fail for a while (here its retrieval's own service
// is down) logs the warning once, and the count when the claims succeed
// again, not a line per poll.
func TestClaimWarningLoggedOnceWithCount(t *testing.T) {
	logs := tapKlog(t)
	e := newEnv(t, 0)
	const proc = "warn-once"
	var failing atomic.Int64
	l, err := New(e.conn, Config{
		Process: proc,
		Retrieve: func(ctx context.Context, tx *bmdb.Tx, limit int32) ([]uuid.UUID, error) {
			if failing.Add(1) <= 40 {
				return nil, errors.New("inventory service unavailable")
			}
			return nil, nil
		},
		Work:    func(context.Context, *bmdb.Work) (func(*bmdb.Tx) error, error) { return nil, nil },
		PollMin: 5 * time.Millisecond, PollMax: 10 * time.Millisecond,
		StopWhenIdle: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := returned(t, runAsync(t, l), time.Minute); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if n := failing.Load(); n <= 40 {
		t.Fatalf("the retrieval ran %d times, want the 40 failures and more", n)
	}
	lines := logs.with("worker "+proc+": claiming", "inventory service unavailable")
	if len(lines) != 2 {
		t.Fatalf("%d warning lines, want 2 (the first, then the count):\n%s", len(lines), strings.Join(lines, "\n"))
	}
	m := regexp.MustCompile(`\(repeated (\d+) times in [0-9.]+m?s\)$`).FindStringSubmatch(lines[1])
	if m == nil || strings.Contains(lines[0], "repeated") {
		t.Fatalf("want the warning, then its count; got:\n%s", strings.Join(lines, "\n"))
	}
	// Each failed claim ran the retrieval once: 40 failures, one logged.
	if n, _ := strconv.Atoi(m[1]); n != 39 {
		t.Errorf("the count says %d repeats, want 39", n)
	}
}

// A retrieval that returns an id that is not a machine is a bug of the
// application's: Run ends at once with an error wrapping
// bmdb.ErrUnknownMachine and ErrPermanent that names the process and the
// id (not a warning every poll, then nil), alone or in a group, with
// StopWhenIdle or without.
func TestUnknownMachineEndsRun(t *testing.T) {
	for i, tc := range []struct {
		name  string
		idle  time.Duration
		group bool
	}{
		{name: "alone"},
		{name: "alone, stop when idle", idle: 100 * time.Millisecond},
		{name: "group, stop when idle", idle: 100 * time.Millisecond, group: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := tapKlog(t)
			e := newEnv(t, 3)
			proc := fmt.Sprintf("unknown-id-%d", i)
			bad := uuid.New()
			cfg := Config{
				Process: proc,
				Retrieve: func(ctx context.Context, tx *bmdb.Tx, limit int32) ([]uuid.UUID, error) {
					return []uuid.UUID{bad}, nil
				},
				Work:    func(context.Context, *bmdb.Work) (func(*bmdb.Tx) error, error) { return nil, nil },
				PollMin: 5 * time.Millisecond, PollMax: 10 * time.Millisecond,
				StopWhenIdle: tc.idle,
			}
			l, err := New(e.conn, cfg)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if tc.group {
				// Beside a stage that works on the real machines.
				other, newErr := New(e.conn, Config{Process: process, Retrieve: retrieveNotDone, StopWhenIdle: tc.idle,
					Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) { return markDone(w), nil }})
				if newErr != nil {
					t.Fatal(newErr)
				}
				err = returned(t, runAllAsync(t, other, l), 30*time.Second)
			} else {
				err = returned(t, runAsync(t, l), 30*time.Second)
			}
			took := time.Since(start)
			if !errors.Is(err, bmdb.ErrUnknownMachine) || !errors.Is(err, ErrPermanent) {
				t.Fatalf("Run = %v, want an error wrapping bmdb.ErrUnknownMachine and ErrPermanent", err)
			}
			for _, want := range []string{"worker " + proc + ": claiming", "not a machine", bad.String()} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Run's error does not say %q: %v", want, err)
				}
			}
			// The first claim ends Run: a session start, one claim and a
			// session close (100 to 220 ms measured at a load of 12 on 2
			// cores; before, Run did not return at all).
			if took > 10*time.Second {
				t.Errorf("Run returned after %v", took)
			}
			if lines := logs.with(bad.String()); len(lines) != 1 || !strings.HasPrefix(lines[0], "E") {
				t.Errorf("%d log lines name the id, want the one error:\n%s", len(lines), strings.Join(lines, "\n"))
			}
			if n := l.Stats().Polls; n != 1 {
				t.Errorf("%d claims, want 1: the first one ends Run", n)
			}
			if n := e.count("SELECT count(*) FROM sessions"); n != 0 {
				t.Errorf("%d sessions left after Run returned", n)
			}
		})
	}
}
