package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
)

// latch is a callback's wait, for holding a group's transaction open while
// other calls queue behind it.
type latch struct {
	ch      chan struct{}
	once    sync.Once
	reached chan struct{} // closed when the first waiter arrives
	arrived sync.Once
}

func newLatch() *latch { return &latch{ch: make(chan struct{}), reached: make(chan struct{})} }

// open lets every waiter through, now and later.
func (l *latch) open() { l.once.Do(func() { close(l.ch) }) }

// wait waits for the latch to open.
func (l *latch) wait() {
	l.arrived.Do(func() { close(l.reached) })
	<-l.ch
}

// held wraps a retrieve so that it waits for the latch.
func (l *latch) held(retrieve func(*Tx) ([]uuid.UUID, error)) func(*Tx) ([]uuid.UUID, error) {
	return func(tx *Tx) ([]uuid.UUID, error) {
		l.wait()
		return retrieve(tx)
	}
}

// inside waits until a transaction waits at the latch: it has taken in its
// group's members.
func (l *latch) inside(t *testing.T) {
	t.Helper()
	select {
	case <-l.reached:
	case <-time.After(5 * time.Second):
		t.Fatal("timed out waiting for the first transaction to reach the latch")
	}
}

// queued returns how many calls wait in q.
func queued[R any](q *queue[R]) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiting)
}

// startedPerTransaction returns the sizes of the session's claim
// statements, from the Started rows each wrote (they share its
// statement_timestamp()): with one statement per transaction, the sizes of
// its claim transactions.
func (e *env) startedPerTransaction(s *Session) []int {
	e.t.Helper()
	rows, err := e.db.Query(`SELECT count(*) FROM work_history WHERE session_id = $1 AND event = 'Started'
		GROUP BY at ORDER BY min(id)`, s.ID())
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var sizes []int
	for rows.Next() {
		var n int
		if err := rows.Scan(&n); err != nil {
			e.t.Fatal(err)
		}
		sizes = append(sizes, n)
	}
	return sizes
}

// Concurrent Work calls of a session are served by one claim transaction
// for whatever is queued when the previous one ends, and each caller gets a
// machine of its own.
func TestConcurrentWorksShareATransaction(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open(func(c *Config) { c.SessionInterval = 10 * time.Second })
	exact(c) // choreographed: no injected failures in cockroach mode
	s := e.session(c)
	const n = 12
	machines := make([]uuid.UUID, n)
	for i := range machines {
		machines[i] = e.machine()
	}
	hold := newLatch()
	defer hold.open()
	works := make([]*Work, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	wg.Go(func() {
		works[0], errs[0] = s.Work(context.Background(), "install", hold.held(retrieveAll(machines...)))
	})
	hold.inside(t)
	q := s.groups.of("install")
	for i := 1; i < n; i++ {
		wg.Go(func() { works[i], errs[i] = s.Work(context.Background(), "install", retrieveAll(machines[1:]...)) })
	}
	eventually(t, 5*time.Second, "the other claims queued", func() bool { return queued(q) == n-1 })
	hold.open()
	wg.Wait()
	got := map[uuid.UUID]bool{}
	for i, w := range works {
		if errs[i] != nil {
			t.Fatalf("Work %d: %v", i, errs[i])
		}
		if got[w.Machine()] {
			t.Fatalf("machine %s handed out twice", w.Machine())
		}
		got[w.Machine()] = true
	}
	if sizes := e.startedPerTransaction(s); !slices.Equal(sizes, []int{1, n - 1}) {
		t.Errorf("claims per transaction = %v, want [1 %d]", sizes, n-1)
	}
}

// A group of concurrent ends commits together, and each caller gets its
// own outcome: a lost claim fails only its Finish (ErrWorkLost), a commit
// callback's error only its own (the Work stays open), and the others
// commit, with their callbacks.
func TestGroupedEndsFailOnlyTheirOwnCaller(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open(func(c *Config) { c.SessionInterval = 10 * time.Second })
	exact(c) // choreographed: no injected failures in cockroach mode
	s := e.session(c)
	const n = 8
	machines := make([]uuid.UUID, n+1)
	for i := range machines {
		machines[i] = e.machine()
	}
	works, err := s.WorkBatch(context.Background(), "install", n+1, retrieveAll(machines...))
	if err != nil || len(works) != n+1 {
		t.Fatalf("WorkBatch = %d works, %v", len(works), err)
	}
	first, lost, bad := works[0], works[1], works[2]
	e.exec("DELETE FROM work WHERE machine_id = $1", lost.Machine())
	errBad := errors.New("tag table refused it")

	hold := newLatch()
	defer hold.open()
	var wg sync.WaitGroup
	errs := make([]error, len(works))
	wg.Go(func() {
		errs[0] = first.Finish(context.Background(), func(tx *Tx) error {
			hold.wait()
			return tagCommit(first.Machine())(tx)
		})
	})
	hold.inside(t)
	for i, w := range works[1:] {
		wg.Go(func() {
			switch w {
			case bad:
				errs[i+1] = w.Finish(context.Background(), func(*Tx) error { return errBad })
			case works[3]:
				errs[i+1] = w.Fail(context.Background(), &testBackoff, "flaky BMC")
			default:
				errs[i+1] = w.Finish(context.Background(), tagCommit(w.Machine()))
			}
		})
	}
	eventually(t, 5*time.Second, "the other ends queued", func() bool { return queued(s.groups.of("install")) == n })
	hold.open()
	wg.Wait()

	for i, w := range works {
		switch {
		case w == lost:
			if !errors.Is(errs[i], ErrWorkLost) {
				t.Errorf("Finish of the lost claim = %v, want ErrWorkLost", errs[i])
			}
		case w == bad:
			if !errors.Is(errs[i], errBad) {
				t.Errorf("Finish with a failing commit = %v, want its error", errs[i])
			}
		case errs[i] != nil:
			t.Errorf("end of %s: %v", w.Machine(), errs[i])
		case (i == 0 || i > 3) && !e.tagged(w.Machine()):
			t.Errorf("machine %s finished without its commit", w.Machine())
		}
	}
	if e.tagged(bad.Machine()) || e.tagged(lost.Machine()) {
		t.Error("a failed Finish committed its callback")
	}
	if n := e.count("SELECT count(*) FROM work WHERE machine_id = $1", bad.Machine()); n != 1 {
		t.Fatalf("the Work whose commit failed is not open (%d claims)", n)
	}
	if err := bad.Finish(context.Background(), tagCommit(bad.Machine())); err != nil {
		t.Errorf("retried Finish: %v", err)
	}
	if n := e.count("SELECT count(*) FROM work_backoff WHERE machine_id = $1 AND cause = 'flaky BMC'", works[3].Machine()); n != 1 {
		t.Errorf("the failed Work has %d backoffs, want 1", n)
	}
	// Finished: all but the lost, failing and failed ones, then the retried
	// one.
	if got, want := e.count("SELECT count(*) FROM work_history WHERE session_id = $1 AND event = 'Finished'", s.ID()), len(works)-3+1; got != want {
		t.Errorf("%d Finished rows, want %d", got, want)
	}
}

// A call whose context ends while it is queued leaves the queue with the
// context's error and claims nothing; one already done does not queue.
func TestQueuedCallLeavesOnCancel(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open(func(c *Config) { c.SessionInterval = 10 * time.Second })
	exact(c) // choreographed: no injected failures in cockroach mode
	s := e.session(c)
	a, b := e.machine(), e.machine()
	hold := newLatch()
	defer hold.open()
	var wg sync.WaitGroup
	var first *Work
	var firstErr error
	wg.Go(func() { first, firstErr = s.Work(context.Background(), "install", hold.held(retrieveAll(a))) })
	hold.inside(t)
	q := s.groups.of("install")
	ctx, cancel := context.WithCancel(context.Background())
	var queuedErr error
	wg.Go(func() { _, queuedErr = s.Work(ctx, "install", retrieveAll(b)) })
	eventually(t, 5*time.Second, "the second claim queued", func() bool { return queued(q) == 1 })
	cancel()
	eventually(t, 5*time.Second, "the second claim gone", func() bool { return queued(q) == 0 })
	hold.open()
	wg.Wait()
	if firstErr != nil || first.Machine() != a {
		t.Fatalf("first Work = %v, %v", first, firstErr)
	}
	if !errors.Is(queuedErr, context.Canceled) {
		t.Errorf("canceled queued Work = %v, want context.Canceled", queuedErr)
	}
	if n := e.count("SELECT count(*) FROM work WHERE machine_id = $1", b); n != 0 {
		t.Errorf("the canceled Work claimed its machine")
	}
}

// Close racing an open group: the group's transaction and the calls queued
// behind it fail with ErrSessionClosed, and nothing they claimed stays.
func TestCloseRacingAGroup(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open(func(c *Config) { c.SessionInterval = 2 * time.Second })
	exact(c) // choreographed: no injected failures in cockroach mode
	s, err := c.StartSession(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	machines := make([]uuid.UUID, 5)
	for i := range machines {
		machines[i] = e.machine()
	}
	hold := newLatch()
	defer hold.open()
	errs := make([]error, len(machines))
	var wg sync.WaitGroup
	wg.Go(func() { _, errs[0] = s.Work(context.Background(), "install", hold.held(retrieveAll(machines...))) })
	hold.inside(t)
	q := s.groups.of("install")
	for i := 1; i < len(machines); i++ {
		wg.Go(func() { _, errs[i] = s.Work(context.Background(), "install", retrieveAll(machines...)) })
	}
	eventually(t, 5*time.Second, "the other claims queued", func() bool { return queued(q) == len(machines)-1 })
	closed := make(chan error, 1)
	go func() { closed <- s.Close(context.Background()) }()
	eventually(t, 5*time.Second, "the session closing", func() bool { return s.Err() != nil })
	hold.open()
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, ErrSessionClosed) {
			t.Errorf("Work %d = %v, want ErrSessionClosed", i, err)
		}
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	if n := e.count("SELECT count(*) FROM work") + e.count("SELECT count(*) FROM sessions WHERE session_id = $1", s.ID()); n != 0 {
		t.Errorf("%d claims or session rows left", n)
	}
	if n := e.count("SELECT count(*) FROM work_history WHERE session_id = $1 AND event = 'Started'", s.ID()); n != 0 {
		t.Errorf("%d Started rows committed by a closed session's group", n)
	}
}

// FinishWith: one CommitGroup call commits every Work of the group that
// passes it; if it fails, the Works are finished one at a time, so that
// only the one it refuses fails.
func TestFinishWithCommitGroup(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open(func(c *Config) { c.SessionInterval = 10 * time.Second })
	exact(c) // choreographed: no injected failures in cockroach mode
	s := e.session(c)
	machines := make([]uuid.UUID, 6)
	for i := range machines {
		machines[i] = e.machine()
	}
	works, err := s.WorkBatch(context.Background(), "install", len(machines), retrieveAll(machines...))
	if err != nil || len(works) != len(machines) {
		t.Fatalf("WorkBatch = %d works, %v", len(works), err)
	}
	bad := works[len(works)-1].Machine()
	errBad := errors.New("refused")
	var mu sync.Mutex
	var calls [][]uuid.UUID
	g := &CommitGroup{Commit: func(tx *Tx, ws []*Work) error {
		var ids []uuid.UUID
		for _, w := range ws {
			if w.Machine() == bad {
				return errBad
			}
			ids = append(ids, w.Machine())
		}
		mu.Lock()
		calls = append(calls, ids)
		mu.Unlock()
		for _, id := range ids {
			if err := tagCommit(id)(tx); err != nil {
				return err
			}
		}
		return nil
	}}
	hold := newLatch()
	defer hold.open()
	var wg sync.WaitGroup
	errs := make([]error, len(works))
	wg.Go(func() {
		errs[0] = works[0].Finish(context.Background(), func(tx *Tx) error {
			hold.wait()
			return tagCommit(works[0].Machine())(tx)
		})
	})
	hold.inside(t)
	for i, w := range works[1:] {
		wg.Go(func() { errs[i+1] = w.FinishWith(context.Background(), g) })
	}
	eventually(t, 5*time.Second, "the FinishWith calls queued", func() bool { return queued(s.groups.of("install")) == len(works)-1 })
	hold.open()
	wg.Wait()
	for i, w := range works {
		switch {
		case w.Machine() == bad:
			if !errors.Is(errs[i], errBad) || e.tagged(bad) {
				t.Errorf("FinishWith refused by the group = %v (tagged %v), want its error and no tag", errs[i], e.tagged(bad))
			}
		case errs[i] != nil || !e.tagged(w.Machine()):
			t.Errorf("Finish of %s = %v (tagged %v)", w.Machine(), errs[i], e.tagged(w.Machine()))
		}
	}
	if err := works[len(works)-1].Cancel(context.Background()); err != nil {
		t.Errorf("the refused Work is not open: Cancel = %v", err)
	}
	if nilGroup := works[0].FinishWith(context.Background(), nil); !errors.Is(nilGroup, ErrInvalidArgument) {
		t.Errorf("FinishWith(nil) = %v, want ErrInvalidArgument", nilGroup)
	}
}

// A group whose transaction fails for one member's retrieve is retried one
// by one; a member with nothing to do must still get ErrNothingToDo.
func TestIsolatedRetryKeepsNothingToDo(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open(func(c *Config) { c.SessionInterval = 10 * time.Second })
	exact(c)
	s := e.session(c)
	a := e.machine()
	hold := newLatch()
	defer hold.open()
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = s.Work(context.Background(), "install", hold.held(retrieveAll(a))) })
	hold.inside(t)
	q := s.groups.of("install")
	boom := errors.New("boom")
	var bad, empty error
	var emptyWorks []*Work
	var panicked any
	wg.Go(func() {
		_, bad = s.Work(context.Background(), "install", func(*Tx) ([]uuid.UUID, error) { return nil, boom })
	})
	wg.Go(func() {
		defer func() { panicked = recover() }()
		emptyWorks, empty = s.WorkBatch(context.Background(), "install", 1, func(*Tx) ([]uuid.UUID, error) { return nil, nil })
	})
	eventually(t, 5*time.Second, "queued", func() bool { return queued(q) == 2 })
	hold.open()
	wg.Wait()
	if panicked != nil || !errors.Is(bad, boom) {
		t.Errorf("the failing retrieve's Work = %v (panic %v), want its error", bad, panicked)
	}
	if !errors.Is(empty, ErrNothingToDo) {
		t.Errorf("WorkBatch with nothing = %d works, %v; want ErrNothingToDo", len(emptyWorks), empty)
	}
}

// A member whose own ctx ends while its group runs, and whose retrieve
// queries with that ctx (as the package example does), must not fail the
// other members of its group.
func TestOneCallersContextFailsOnlyItsClaim(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open(func(c *Config) { c.SessionInterval = 10 * time.Second })
	exact(c)
	s := e.session(c)
	a, b, d := e.machine(), e.machine(), e.machine()
	hold := newLatch()
	defer hold.open()
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = s.Work(context.Background(), "install", hold.held(retrieveAll(a))) })
	hold.inside(t)
	q := s.groups.of("install")
	ctxB, cancelB := context.WithCancel(context.Background())
	hold2 := newLatch()
	defer hold2.open()
	var errB, errC error
	wg.Go(func() {
		_, errB = s.Work(ctxB, "install", func(tx *Tx) ([]uuid.UUID, error) {
			hold2.wait()
			var one int
			if err := tx.DBTX().QueryRowContext(ctxB, "SELECT 1").Scan(&one); err != nil {
				return nil, err
			}
			return []uuid.UUID{b}, nil
		})
	})
	eventually(t, 5*time.Second, "B queued", func() bool { return queued(q) == 1 })
	wg.Go(func() { _, errC = s.Work(context.Background(), "install", retrieveAll(d)) })
	eventually(t, 5*time.Second, "C queued", func() bool { return queued(q) == 2 })
	hold.open()
	hold2.inside(t)
	cancelB()
	hold2.open()
	wg.Wait()
	if errC != nil || !errors.Is(errB, context.Canceled) {
		t.Errorf("B (ctx ended) = %v, C = %v; want context.Canceled and nil", errB, errC)
	}
}

// Two Works of one session on the same machine (the first's end committed
// ambiguously, the machine was claimed again): ending both in one group
// must not report the stale one as ended, nor write two history rows.
func TestStaleAndNewClaimOfAMachineInOneGroup(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open(func(c *Config) { c.SessionInterval = 10 * time.Second })
	exact(c)
	s := e.session(c)
	m := e.machine()
	w1, err := s.Work(context.Background(), "install", retrieveAll(m))
	if err != nil {
		t.Fatal(err)
	}
	e.exec("DELETE FROM work WHERE machine_id = $1", m) // as if w1's ambiguous Finish committed
	w2, err := s.Work(context.Background(), "install", retrieveAll(m))
	if err != nil {
		t.Fatal(err)
	}
	x := e.machine()
	w0, err := s.Work(context.Background(), "install", retrieveAll(x))
	if err != nil {
		t.Fatal(err)
	}
	hold := newLatch()
	defer hold.open()
	var wg sync.WaitGroup
	wg.Go(func() { _ = w0.Finish(context.Background(), func(*Tx) error { hold.wait(); return nil }) })
	hold.inside(t)
	var e1, e2 error
	wg.Go(func() { e1 = w1.Fail(context.Background(), nil, "stale") })
	eventually(t, 5*time.Second, "q1", func() bool { return queued(s.groups.of("install")) == 1 })
	wg.Go(func() { e2 = w2.Fail(context.Background(), nil, "fresh") })
	eventually(t, 5*time.Second, "q2", func() bool { return queued(s.groups.of("install")) == 2 })
	hold.open()
	wg.Wait()
	n := e.count("SELECT count(*) FROM work_history WHERE claim_id = $1 AND event = 'Failed'", w2.ClaimID())
	if !errors.Is(e1, ErrWorkLost) || e2 != nil || n != 1 {
		t.Errorf("stale Work's Fail = %v (want ErrWorkLost), new one's = %v; %d Failed rows for the new claim (want 1)", e1, e2, n)
	}
}

// The same for ends: a Finish whose commit queries with its own ended ctx
// fails alone.
func TestOneCallersContextFailsOnlyItsFinish(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open(func(c *Config) { c.SessionInterval = 10 * time.Second })
	exact(c)
	s := e.session(c)
	ms := []uuid.UUID{e.machine(), e.machine(), e.machine()}
	works, err := s.WorkBatch(context.Background(), "install", 3, retrieveAll(ms...))
	if err != nil || len(works) != 3 {
		t.Fatal(err)
	}
	hold := newLatch()
	defer hold.open()
	var wg sync.WaitGroup
	wg.Go(func() { _ = works[0].Finish(context.Background(), func(*Tx) error { hold.wait(); return nil }) })
	hold.inside(t)
	ctxB, cancelB := context.WithCancel(context.Background())
	hold2 := newLatch()
	defer hold2.open()
	var errB, errC error
	wg.Go(func() {
		errB = works[1].Finish(ctxB, func(tx *Tx) error {
			hold2.wait()
			_, err := tx.DBTX().ExecContext(ctxB, "SELECT 1")
			return err
		})
	})
	eventually(t, 5*time.Second, "q1", func() bool { return queued(s.groups.of("install")) == 1 })
	wg.Go(func() { errC = works[2].Finish(context.Background(), func(*Tx) error { return nil }) })
	eventually(t, 5*time.Second, "q2", func() bool { return queued(s.groups.of("install")) == 2 })
	hold.open()
	hold2.inside(t)
	cancelB()
	hold2.open()
	wg.Wait()
	if errC != nil || !errors.Is(errB, context.Canceled) {
		t.Errorf("B's Finish (ctx ended) = %v, C's = %v; want context.Canceled and nil", errB, errC)
	}
}

// behindHeldClaim holds a group of s for "install" open with a Work of x
// whose retrieve waits, and starts each call once the ones before it have
// queued behind that group. It returns release, which lets the group go
// and waits for the calls.
func behindHeldClaim(t *testing.T, s *Session, x uuid.UUID, calls ...func()) (release func()) {
	t.Helper()
	q := s.groups.of("install")
	hold := newLatch()
	t.Cleanup(hold.open)
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = s.Work(context.Background(), "install", hold.held(retrieveAll(x))) })
	hold.inside(t)
	for i, call := range calls {
		wg.Go(call)
		eventually(t, 5*time.Second, "the calls queued", func() bool { return queued(q) == i+1 })
	}
	return func() {
		hold.open()
		wg.Wait()
	}
}

// A session's Finish and Work calls for one process that wait together
// share one transaction, the end first: the machine finished is free for
// the claim, and a failing commit callback fails only its Finish while the
// claim that shared its group still commits.
func TestEndsAndClaimsShareATransaction(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open(func(c *Config) { c.SessionInterval = 10 * time.Second })
	exact(c) // choreographed: no injected failures in cockroach mode
	s := e.session(c)
	a, b, x := e.machine(), e.machine(), e.machine()
	wa, err := s.Work(context.Background(), "install", retrieveAll(a))
	if err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		claimed             *Work
		finishErr, claimErr error
		attempts            int64
	}
	run := func(finish func(context.Context) error, claim func(*Tx) ([]uuid.UUID, error)) outcome {
		t.Helper()
		var o outcome
		release := behindHeldClaim(t, s, x,
			func() { o.finishErr = finish(context.Background()) },
			func() { o.claimed, o.claimErr = s.Work(context.Background(), "install", claim) })
		before := c.Stats().TxAttempts
		release()
		o.attempts = c.Stats().TxAttempts - before
		return o
	}

	// Finish a, and claim a again in the same transaction: it is free by
	// the time the claim runs.
	o := run(func(ctx context.Context) error { return wa.Finish(ctx, tagCommit(a)) }, retrieveAll(a))
	if o.finishErr != nil || o.claimErr != nil {
		t.Fatalf("Finish: %v; Work: %v", o.finishErr, o.claimErr)
	}
	wb := o.claimed
	if wb.Machine() != a || !e.tagged(a) {
		t.Fatalf("claimed %s (tagged: %v), want %s claimed again after its Finish committed", wb.Machine(), e.tagged(a), a)
	}
	if o.attempts != 1 { // after the held claim's attempt, one for both
		t.Errorf("%d transaction attempts, want 1: the Finish and the Work in one", o.attempts)
	}
	if got := e.events(a, s); !slicesEqual(got, "install:Started@1", "install:Finished@1", "install:Started@1") {
		t.Errorf("history of a = %v", got)
	}

	// A failing commit callback fails only its Finish; the Work of the
	// same group claims b.
	boom := errors.New("boom")
	o = run(func(ctx context.Context) error {
		return wb.Finish(ctx, func(*Tx) error { return boom })
	}, retrieveAll(b))
	if !errors.Is(o.finishErr, boom) || o.claimErr != nil || o.claimed.Machine() != b {
		t.Fatalf("Finish: %v (want boom); Work: %v, %v (want b)", o.finishErr, o.claimed, o.claimErr)
	}
	if n := e.count("SELECT count(*) FROM work WHERE machine_id = $1", a); n != 1 {
		t.Errorf("a has %d claims after its Finish failed, want 1 (still held)", n)
	}
	if err := wb.Finish(context.Background(), noCommit); err != nil {
		t.Errorf("Finish after the failed one: %v", err)
	}
}

// When the COMMIT of a group of an end and a claim is ambiguous and the
// claim is found held, the transaction committed: the Finish returns nil,
// not ErrAmbiguousCommit, and the Work its machine.
func TestAmbiguousGroupWithAClaimHeldCommittedItsEnds(t *testing.T) {
	e := newWorkEnv(t)
	// A long interval: no heartbeat commits while the hook is armed.
	c := e.open(func(c *Config) { c.SessionInterval = time.Minute })
	exact(c)
	var armed atomic.Bool
	var pass atomic.Int32 // commits let through while armed
	c.hooks.commit = func(tx *sql.Tx) error {
		if err := tx.Commit(); err != nil || !armed.Load() || pass.Add(-1) >= 0 {
			return err
		}
		armed.Store(false)
		return io.ErrUnexpectedEOF // committed, but the answer was lost
	}
	s := e.session(c)
	a, b, x := e.machine(), e.machine(), e.machine()
	wa, err := s.Work(context.Background(), "install", retrieveAll(a))
	if err != nil {
		t.Fatal(err)
	}
	var finishErr, claimErr error
	var wb *Work
	release := behindHeldClaim(t, s, x,
		func() { finishErr = wa.Finish(context.Background(), tagCommit(a)) },
		func() { wb, claimErr = s.Work(context.Background(), "install", retrieveAll(b)) })
	pass.Store(1) // the held claim's commit, then the group's
	armed.Store(true)
	release()
	if armed.Load() {
		t.Fatal("the group's COMMIT was not made ambiguous")
	}
	if finishErr != nil || claimErr != nil || wb.Machine() != b {
		t.Fatalf("Finish: %v; Work: %v, %v; want nil and b", finishErr, wb, claimErr)
	}
	if !e.tagged(a) {
		t.Error("a's commit callback did not take effect")
	}
	if got := e.events(a, s); !slicesEqual(got, "install:Started@1", "install:Finished@1") {
		t.Errorf("history of a = %v", got)
	}
}
