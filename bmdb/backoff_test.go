package bmdb

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/model"
)

var testBackoff = Backoff{Initial: time.Second, Maximum: 4 * time.Second, Exponent: 2}

func TestBackoffNext(t *testing.T) {
	b := Backoff{Initial: time.Second, Maximum: 10 * time.Second, Exponent: 3}
	for _, tc := range []struct {
		prev, want time.Duration
	}{
		{0, time.Second},
		{time.Second, 3 * time.Second},
		{3 * time.Second, 9 * time.Second},
		{9 * time.Second, 10 * time.Second},                  // capped
		{10 * time.Second, 10 * time.Second},                 // stays capped
		{time.Hour, 10 * time.Second},                        // stored under an older, larger Maximum
		{100 * time.Millisecond, time.Second},                // stored under an older, smaller Initial
		{time.Duration(math.MaxInt64 / 2), 10 * time.Second}, // no overflow
	} {
		if got := (backoffPolicy{b}).Next(tc.prev); got != tc.want {
			t.Errorf("next(%v) = %v, want %v", tc.prev, got, tc.want)
		}
	}
	constant := Backoff{Initial: time.Second, Maximum: time.Minute, Exponent: 1}
	if got := (backoffPolicy{constant}).Next(time.Second); got != time.Second {
		t.Errorf("Exponent 1: next(1s) = %v", got)
	}
}

func TestBackoffWait(t *testing.T) {
	b := Backoff{Initial: time.Second, Maximum: time.Minute, Exponent: 2, Jitter: 0.5}
	for _, tc := range []struct {
		u    float64
		want time.Duration
	}{{0, 10 * time.Second}, {0.5, 7500 * time.Millisecond}, {0.999999, 5*time.Second + 5*time.Microsecond}} {
		if got := (backoffPolicy{b}).Wait(10*time.Second, tc.u); got != tc.want {
			t.Errorf("wait(10s, %v) = %v, want %v", tc.u, got, tc.want)
		}
	}
	if got := (backoffPolicy{testBackoff}).Wait(10*time.Second, 0.7); got != 10*time.Second {
		t.Errorf("no jitter: wait = %v", got)
	}
}

// backoffRow is a row of work_backoff.
type backoffRow struct {
	MachineID       uuid.UUID
	Process         string
	Until           time.Time
	Cause           string
	IntervalSeconds float64
}

// backoffRow returns the backoff of (m, install) with seconds left on the
// database clock.
func (e *env) backoffRow(m any) (backoffRow, float64) {
	e.t.Helper()
	var b backoffRow
	var left float64
	err := e.db.QueryRow(`SELECT machine_id, process, until, cause, interval_seconds,
		EXTRACT(EPOCH FROM until - now())::FLOAT8 FROM work_backoff WHERE machine_id = $1 AND process = 'install'`, m).
		Scan(&b.MachineID, &b.Process, &b.Until, &b.Cause, &b.IntervalSeconds, &left)
	if err != nil {
		e.t.Fatalf("reading backoff: %v", err)
	}
	return b, left
}

// Invariant 6: Fail backs off exponentially from the previous interval, up
// to the cap, on the database clock; Work refuses the machine meanwhile
// whatever retrieve says; a Finish clears it.
func TestFailBackoffGrowsCapsAndClears(t *testing.T) {
	e := newWorkEnv(t)
	s := e.session(e.open())
	m := e.machine()
	for i, want := range []float64{1, 2, 4, 4} {
		w, err := s.Work(context.Background(), "install", retrieveAll(m))
		if err != nil {
			t.Fatalf("Work #%d: %v", i, err)
		}
		if err := w.Fail(context.Background(), &testBackoff, "disk not found"); err != nil {
			t.Fatalf("Fail #%d: %v", i, err)
		}
		b, left := e.backoffRow(m)
		if b.IntervalSeconds != want || b.Cause != "disk not found" {
			t.Errorf("failure #%d: interval %vs cause %q, want %vs", i, b.IntervalSeconds, b.Cause, want)
		}
		if left <= want-0.5 || left > want {
			t.Errorf("failure #%d: backoff ends in %.3fs on the database clock, want about %vs", i, left, want)
		}
		// A careless retrieval that proposes the machine anyway gets
		// nothing; a proper one does not see it.
		if _, err := s.Work(context.Background(), "install", retrieveAll(m)); !errors.Is(err, ErrNothingToDo) {
			t.Fatalf("Work during backoff = %v, want ErrNothingToDo", err)
		}
		ids, _ := e.q.MachinesWithoutWork(context.Background(), model.MachinesWithoutWorkParams{Process: "install", RowLimit: 10})
		if len(ids) != 0 {
			t.Errorf("MachinesWithoutWork returns a machine in backoff")
		}
		// Skip the wait: end this backoff on the database clock.
		e.exec("UPDATE work_backoff SET until = now() WHERE machine_id = $1", m)
	}
	w, err := s.Work(context.Background(), "install", retrieveAll(m))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Finish(context.Background(), noCommit); err != nil {
		t.Fatal(err)
	}
	if n := e.count("SELECT count(*) FROM work_backoff"); n != 0 {
		t.Error("Finish did not clear the backoff")
	}
	// After clearing, the next failure starts again from Initial.
	w, _ = s.Work(context.Background(), "install", retrieveAll(m))
	if err := w.Fail(context.Background(), &testBackoff, "again"); err != nil {
		t.Fatal(err)
	}
	if b, _ := e.backoffRow(m); b.IntervalSeconds != 1 {
		t.Errorf("interval after clearing = %v, want 1", b.IntervalSeconds)
	}
}

// Invariant 6: a backoff expires by itself on the database clock.
func TestBackoffExpires(t *testing.T) {
	e := newWorkEnv(t)
	s := e.session(e.open())
	m := e.machine()
	w, err := s.Work(context.Background(), "install", retrieveIdle("install"))
	if err != nil {
		t.Fatal(err)
	}
	short := Backoff{Initial: 300 * time.Millisecond, Maximum: time.Second, Exponent: 2, Jitter: 0.1}
	failedAt := time.Now()
	if err := w.Fail(context.Background(), &short, "flaky"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Work(context.Background(), "install", retrieveIdle("install")); !errors.Is(err, ErrNothingToDo) {
		t.Fatalf("Work right after Fail = %v, want ErrNothingToDo", err)
	}
	var again *Work
	eventually(t, 3*time.Second, "the backoff to expire", func() bool {
		again, err = s.Work(context.Background(), "install", retrieveIdle("install"))
		return err == nil
	})
	if waited := time.Since(failedAt); waited < 250*time.Millisecond {
		t.Errorf("claimable again after %v, before the jittered backoff (>= 270ms) ended", waited)
	}
	if again.Machine() != m {
		t.Fatal("claimed another machine")
	}
	if got := e.events(m, s); !slicesEqual(got, "install:Started@1", "install:Failed@1", "install:Started@1") {
		t.Errorf("history = %v", got)
	}
}

// Fail without a backoff records the failure and leaves the machine
// claimable; Cancel never backs off.
func TestFailWithoutBackoffAndCancel(t *testing.T) {
	e := newWorkEnv(t)
	s := e.session(e.open())
	m := e.machine()
	w, _ := s.Work(context.Background(), "install", retrieveAll(m))
	if err := w.Fail(context.Background(), nil, "transient"); err != nil {
		t.Fatal(err)
	}
	w, err := s.Work(context.Background(), "install", retrieveAll(m))
	if err != nil {
		t.Fatalf("Work after Fail without backoff: %v", err)
	}
	if err := w.Cancel(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Work(context.Background(), "install", retrieveAll(m)); err != nil {
		t.Fatalf("Work after Cancel: %v", err)
	}
	if n := e.count("SELECT count(*) FROM work_backoff"); n != 0 {
		t.Error("backoff without a Backoff")
	}
	if got := e.events(m, s); !slicesEqual(got, "install:Started@1", "install:Failed@1", "install:Started@1", "install:Canceled@1", "install:Started@1") {
		t.Errorf("history = %v", got)
	}
}
