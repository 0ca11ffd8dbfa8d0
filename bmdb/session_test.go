package bmdb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
	"github.com/bmdb-dev/bmdb/model"
)

// Invariant 2: StartSession inserts a row with deadline = now() + interval,
// and the heartbeat keeps moving it forward on the database clock.
func TestSessionHeartbeatExtendsDeadline(t *testing.T) {
	e := newEnv(t)
	s := e.session(e.open())

	row, err := e.q.SessionGet(context.Background(), s.ID())
	if err != nil {
		t.Fatal(err)
	}
	if row.ComponentName != "test" || row.RuntimeInfo != t.Name() || row.IntervalSeconds != testInterval.Seconds() {
		t.Errorf("session row = %+v", row)
	}
	if n := e.count("SELECT count(*) FROM sessions WHERE session_id = $1 AND deadline > now() AND deadline <= now() + INTERVAL '1 second'", s.ID()); n != 1 {
		t.Fatalf("deadline %v is not within one interval from now on the database clock", row.Deadline)
	}
	first := row.Deadline
	// Three heartbeats are due in 1.5 intervals; see at least two extend the
	// deadline while the session stays alive past its first deadline.
	eventually(t, 3*testInterval, "two heartbeats", func() bool {
		row, err := e.q.SessionGet(context.Background(), s.ID())
		return err == nil && row.Deadline.Sub(first) >= testInterval
	})
	if !e.aliveInDB(s.ID()) || s.Err() != nil {
		t.Fatalf("session not alive after heartbeats: err=%v", s.Err())
	}
	if err := s.Transact(context.Background(), noCommit); err != nil {
		t.Fatalf("Transact on a live session: %v", err)
	}
}

// Without Config.RuntimeInfo, a session's row says which program runs it,
// where, and built from what: bmdbctl sessions and the web pages show it.
func TestSessionRuntimeInfoDefault(t *testing.T) {
	e := newEnv(t)
	s := e.session(e.open(func(c *Config) { c.RuntimeInfo = "" }))
	row, err := e.q.SessionGet(context.Background(), s.ID())
	if err != nil {
		t.Fatal(err)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{filepath.Base(os.Args[0]) + " on " + host, fmt.Sprintf(", pid %d; ", os.Getpid()), runtime.Version()} {
		if !strings.Contains(row.RuntimeInfo, want) {
			t.Errorf("runtime_info %q lacks %q", row.RuntimeInfo, want)
		}
	}
}

// Invariant 2: when heartbeats stop (here: the poke hangs), the session ends
// locally no later than the database expires it, and Transact then refuses.
func TestSessionExpiresWhenHeartbeatStalls(t *testing.T) {
	e := newEnv(t)
	c := e.open()
	c.leaseHooks.BeforeHeartbeat = func(ctx context.Context) error {
		<-ctx.Done() // a heartbeat that never gets an answer
		return ctx.Err()
	}
	probe := testdb.StartDelayProbe(t)
	start := time.Now()
	s := e.session(c)
	waitDone(t, s, 3*testInterval)
	ended := time.Now() // the session ended locally at or before this
	elapsed := ended.Sub(start)

	if !errors.Is(s.Err(), ErrSessionExpired) {
		t.Fatalf("Err() = %v, want ErrSessionExpired", s.Err())
	}
	if !errors.Is(context.Cause(s.Context()), ErrSessionExpired) {
		t.Fatalf("Context cause = %v", context.Cause(s.Context()))
	}
	if elapsed < s.lease.Lifetime()-50*time.Millisecond || elapsed > s.lease.Lifetime()+time.Second {
		t.Errorf("session ended after %v, want about one interval less the clock margin (%v)", elapsed, s.lease.Lifetime())
	}
	// Local death came first: the session ended locally no later than the
	// database's deadline. That deadline, on the local clock, is at most
	// (deadline - now()) after the query returned (now() is read before
	// then); the session ended at most a few scheduling delays (the
	// expiry timer, the heartbeat goroutine, this one) before `ended`.
	// Both bounds come from what this run measured, so a loaded machine
	// widens them by what it cost and an idle one keeps them tight.
	var left float64 // seconds from the database's now() to the deadline
	if err := e.db.QueryRow("SELECT EXTRACT(EPOCH FROM deadline - now())::FLOAT8 FROM sessions WHERE session_id = $1", s.ID()).Scan(&left); err != nil {
		t.Fatal(err)
	}
	dbDeadline := time.Now().Add(time.Duration(left * float64(time.Second)))
	late := 3*probe.Stop() + 10*time.Millisecond
	if ended.Add(-late).After(dbDeadline) {
		t.Errorf("the session ended locally %v after the database's deadline (allowing %v of scheduling delay): the database expired it first",
			ended.Sub(dbDeadline), late)
	}
	if err := s.Transact(context.Background(), noCommit); !errors.Is(err, ErrSessionExpired) {
		t.Fatalf("Transact after expiry = %v, want ErrSessionExpired", err)
	}
}

// Invariant 2: errors shorter than the interval are retried and the session
// survives them. The fault is counted, not timed: the faultyBeats attempts
// right after a heartbeat fail, and the retry after them extends the
// session, which takes a few retry delays, well within the half interval
// between a heartbeat and the deadline it set, however slow the machine.
func TestSessionSurvivesTransientErrors(t *testing.T) {
	const faultyBeats = 3
	e := newEnv(t)
	c := e.open()
	var armed atomic.Bool
	var failed atomic.Int32
	var before atomic.Pointer[time.Time] // the deadline when the fault began
	var beforeErr atomic.Pointer[error]
	var s *Session // set before armed
	c.leaseHooks.BeforeHeartbeat = func(ctx context.Context) error {
		if !armed.Load() || failed.Load() >= faultyBeats {
			return nil
		}
		if failed.Add(1) == 1 {
			// No heartbeat is under way (this is the heartbeat goroutine):
			// a later deadline comes from one that retried the fault.
			var d time.Time
			if err := e.db.QueryRowContext(ctx, "SELECT deadline FROM sessions WHERE session_id = $1", s.ID()).Scan(&d); err != nil {
				beforeErr.Store(&err)
			}
			before.Store(&d)
		}
		return errors.New("injected: connection reset")
	}
	s = e.session(c)
	initial, err := e.q.SessionGet(context.Background(), s.ID())
	if err != nil {
		t.Fatal(err)
	}
	// After the first heartbeat, fail the next attempts.
	eventually(t, 3*testInterval, "the first heartbeat", func() bool {
		row, err := e.q.SessionGet(context.Background(), s.ID())
		return err == nil && row.Deadline.After(initial.Deadline)
	})
	armed.Store(true)
	eventually(t, 3*testInterval, "the deadline to move after the fault", func() bool {
		if s.Err() != nil || failed.Load() < faultyBeats {
			return s.Err() != nil
		}
		row, err := e.q.SessionGet(context.Background(), s.ID())
		return err == nil && row.Deadline.After(*before.Load())
	})
	if err := beforeErr.Load(); err != nil {
		t.Fatalf("reading the deadline when the fault began: %v", *err)
	}
	if s.Err() != nil {
		t.Fatalf("session ended after %d failed heartbeat attempts, a fault shorter than its interval: %v", failed.Load(), s.Err())
	}
	if n := c.Stats().HeartbeatFailures; n < faultyBeats {
		t.Fatalf("%d heartbeat attempts failed, want at least %d: the test did not inject the fault", n, faultyBeats)
	}
}

// Invariant 2, the path Monogon gets wrong: a heartbeat that keeps failing is
// retried until, and only until, one interval after the last success.
func TestSessionGivesUpAfterIntervalOfErrors(t *testing.T) {
	e := newEnv(t)
	c := e.open()
	c.leaseHooks.BeforeHeartbeat = func(context.Context) error { return errors.New("injected: database unreachable") }
	start := time.Now()
	s := e.session(c)
	waitDone(t, s, 3*testInterval)
	elapsed := time.Since(start)

	if !errors.Is(s.Err(), ErrSessionExpired) {
		t.Fatalf("Err() = %v, want ErrSessionExpired", s.Err())
	}
	if elapsed < s.lease.Lifetime()-50*time.Millisecond || elapsed > s.lease.Lifetime()+time.Second {
		t.Errorf("gave up after %v, want about one interval less the clock margin (%v)", elapsed, s.lease.Lifetime())
	}
	if n := c.Stats().HeartbeatFailures; n < 3 {
		t.Errorf("only %d heartbeat attempts failed: errors were not retried", n)
	}
}

// Invariant 2: a session the database has expired is never resurrected.
func TestSessionNotResurrected(t *testing.T) {
	e := newEnv(t)
	s := e.session(e.open())
	e.expireInDB(s.ID(), time.Second)

	waitDone(t, s, 3*testInterval)
	if !errors.Is(s.Err(), ErrSessionExpired) {
		t.Fatalf("Err() = %v, want ErrSessionExpired", s.Err())
	}
	if e.aliveInDB(s.ID()) {
		t.Fatal("heartbeat extended an expired session")
	}
	if n := e.count("SELECT count(*) FROM sessions WHERE session_id = $1 AND deadline < now() - INTERVAL '500 milliseconds'", s.ID()); n != 1 {
		t.Fatal("expired session's deadline moved")
	}
}

// Close stops the goroutine, deletes the row and records open claims as
// Canceled; it is idempotent and every later call fails with ErrSessionClosed.
func TestSessionClose(t *testing.T) {
	e := newEnv(t)
	c := e.open()
	s := e.session(c)
	m := e.machine()
	if _, err := s.Work(context.Background(), "install", retrieveAll(m)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("Done not closed after Close")
	}
	if !errors.Is(s.Err(), ErrSessionClosed) {
		t.Errorf("Err() = %v, want ErrSessionClosed", s.Err())
	}
	if n := e.count("SELECT count(*) FROM sessions WHERE session_id = $1", s.ID()); n != 0 {
		t.Error("session row survives Close")
	}
	if got := e.events(m, s); !slicesEqual(got, "install:Started@1", "install:Canceled@1") {
		t.Errorf("history = %v", got)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := s.Transact(context.Background(), noCommit); !errors.Is(err, ErrSessionClosed) {
		t.Errorf("Transact after Close = %v", err)
	}
	if _, err := s.Work(context.Background(), "install", retrieveAll(m)); !errors.Is(err, ErrSessionClosed) {
		t.Errorf("Work after Close = %v", err)
	}
}

// Close after expiry succeeds and records the claims it removes as Abandoned.
func TestSessionCloseAfterExpiry(t *testing.T) {
	e := newEnv(t)
	s := e.session(e.open())
	m := e.machine()
	if _, err := s.Work(context.Background(), "install", retrieveAll(m)); err != nil {
		t.Fatal(err)
	}
	e.expireInDB(s.ID(), time.Second)
	waitDone(t, s, 3*testInterval)
	if err := s.Close(context.Background()); err != nil {
		t.Fatalf("Close after expiry: %v", err)
	}
	if !errors.Is(s.Err(), ErrSessionExpired) {
		t.Errorf("Err() = %v, want ErrSessionExpired", s.Err())
	}
	if got := e.events(m, s); !slicesEqual(got, "install:Started@1", "install:Abandoned@1") {
		t.Errorf("history = %v", got)
	}
}

// Invariant 7: GC deletes sessions expired for longer than the grace
// period, records their claims as Abandoned exactly once even when many
// components collect at the same time, and leaves younger ones alone.
func TestCollectGarbage(t *testing.T) {
	e := newEnv(t)
	c := e.open(func(c *Config) { c.GCGracePeriod = time.Minute })
	old, young, live := e.session(c), e.session(c), e.session(c)
	m1, m2 := e.machine(), e.machine()
	if _, err := old.Work(context.Background(), "install", retrieveAll(m1)); err != nil {
		t.Fatal(err)
	}
	if _, err := young.Work(context.Background(), "install", retrieveAll(m2)); err != nil {
		t.Fatal(err)
	}
	e.expireInDB(old.ID(), time.Hour)
	e.expireInDB(young.ID(), time.Second)

	const collectors = 6
	deleted := make(chan int64, collectors)
	errs := make(chan error, collectors)
	for range collectors {
		go func() {
			n, err := c.CollectGarbage(context.Background())
			deleted <- n
			errs <- err
		}()
	}
	var total int64
	for range collectors {
		total += <-deleted
		if err := <-errs; err != nil {
			t.Errorf("CollectGarbage: %v", err)
		}
	}
	if total != 1 {
		t.Errorf("concurrent collectors deleted %d sessions in all, want 1", total)
	}
	if n := e.count("SELECT count(*) FROM sessions WHERE session_id = $1", old.ID()); n != 0 {
		t.Error("old expired session not deleted")
	}
	if n := e.count("SELECT count(*) FROM sessions WHERE session_id IN ($1, $2)", young.ID(), live.ID()); n != 2 {
		t.Error("GC deleted a session within its grace period, or a live one")
	}
	if got := e.events(m1, old); !slicesEqual(got, "install:Started@1", "install:Abandoned@1") {
		t.Errorf("history of the collected claim = %v", got)
	}
	if n := e.count("SELECT count(*) FROM work WHERE machine_id = $1", m1); n != 0 {
		t.Error("claim of the collected session survives")
	}
}

// Invariant 7: live sessions collect garbage on their own, every GCPeriod.
func TestSessionCollectsGarbagePeriodically(t *testing.T) {
	e := newEnv(t)
	c := e.open(func(c *Config) { c.GCPeriod = 100 * time.Millisecond; c.GCGracePeriod = time.Millisecond })
	dead := e.session(c)
	e.session(c) // the collector
	m := e.machine()
	if _, err := dead.Work(context.Background(), "install", retrieveAll(m)); err != nil {
		t.Fatal(err)
	}
	// Expired now, as if its heartbeats had stopped: above what an earlier
	// periodic pass read (a deadline moved further back by hand is left to
	// the next full pass, TestPeriodicGCReadsAWindow).
	e.expireInDB(dead.ID(), 0)
	eventually(t, 3*testInterval, "GC to delete the expired session", func() bool {
		return e.count("SELECT count(*) FROM sessions WHERE session_id = $1", dead.ID()) == 0
	})
	if n := e.count("SELECT count(*) FROM work_history WHERE machine_id = $1 AND event = $2", m, model.WorkHistoryEventAbandoned); n != 1 {
		t.Errorf("%d Abandoned rows, want 1", n)
	}
}
