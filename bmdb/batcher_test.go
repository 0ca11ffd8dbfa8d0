package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/goleak"

	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
)

// latch is a callback's wait, for holding a batch's transaction open while
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

// inside waits until a callback waits at the latch.
func (l *latch) inside(t *testing.T) {
	t.Helper()
	select {
	case <-l.reached:
	case <-time.After(30 * time.Second):
		t.Fatal("timed out waiting for a callback to reach the latch")
	}
}

// heldBatch is a batch of a session for "install" held open by a Work
// whose retrieve waits, so that the calls queued behind it form the next
// batch.
type heldBatch struct {
	t    *testing.T
	s    *Session
	hold *latch
	wg   sync.WaitGroup
	n    int // calls queued

	// The held Work's outcome, after release.
	work *Work
	err  error
}

// holdBatch holds a batch of s open with a Work of machine x.
func holdBatch(t *testing.T, s *Session, x uuid.UUID) *heldBatch {
	t.Helper()
	h := &heldBatch{t: t, s: s, hold: newLatch()}
	t.Cleanup(h.hold.open)
	h.wg.Go(func() { h.work, h.err = s.Work(context.Background(), "install", h.hold.held(retrieveAll(x))) })
	h.hold.inside(t)
	return h
}

// queue starts each call once the ones before it have queued behind the
// held batch.
func (h *heldBatch) queue(calls ...func()) {
	h.t.Helper()
	for _, call := range calls {
		h.wg.Go(call)
		h.n++
		eventually(h.t, 5*time.Second, "the calls queued", func() bool { return queued(h.s, "install") == h.n })
	}
}

// release lets the held batch go and waits for it and the queued calls.
func (h *heldBatch) release() {
	h.hold.open()
	h.wg.Wait()
}

// releaseCanceling lets the held batch go, cancels with cancel once a
// callback of the next batch waits at in, lets that callback go on, and
// waits for every call.
func (h *heldBatch) releaseCanceling(in *latch, cancel func()) {
	h.hold.open()
	in.inside(h.t)
	cancel()
	in.open()
	h.release()
}

// behindHeldClaim queues calls behind a batch of s held open with a Work
// of x, and returns the held batch's release.
func behindHeldClaim(t *testing.T, s *Session, x uuid.UUID, calls ...func()) (release func()) {
	t.Helper()
	h := holdBatch(t, s, x)
	h.queue(calls...)
	return h.release
}

// batchEnv is the setup of most batch tests: a database with the work
// tests' tag table, a connection without injected failures (they are
// choreographed), a long interval and one batch at a time (so that calls
// queue behind a held one), and a session.
func batchEnv(t *testing.T) (*env, *Connection, *Session) {
	t.Helper()
	e := newWorkEnv(t)
	c := e.open(func(c *Config) { c.SessionInterval, c.MaxConcurrentBatches = 10*time.Second, 1 })
	exact(c)
	return e, c, e.session(c)
}

// queued returns how many calls of s for process wait for a batch.
func queued(s *Session, process string) int { return s.claims.Waiting(process) }

// startedPerTransaction returns the sizes of the session's claim
// transactions, from the Started rows each wrote (grouped by the
// transaction that wrote them: txKey).
func (e *env) startedPerTransaction(s *Session) []int {
	e.t.Helper()
	rows, err := e.db.Query(`SELECT count(*) FROM work_history WHERE session_id = $1 AND event = 'Started'
		GROUP BY `+txKey()+` ORDER BY min(id)`, s.ID())
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

// Concurrent Work calls of a session are served by one batch for
// whatever is queued when the previous one ends, and each caller gets a
// machine of its own.
func TestConcurrentWorksShareATransaction(t *testing.T) {
	e, _, s := batchEnv(t)
	const n = 12
	machines := make([]uuid.UUID, n)
	for i := range machines {
		machines[i] = e.machine()
	}
	e.fence("install", machines...)
	h := holdBatch(t, s, machines[0])
	works := make([]*Work, n)
	errs := make([]error, n)
	for i := 1; i < n; i++ {
		h.queue(func() { works[i], errs[i] = s.Work(context.Background(), "install", retrieveAll(machines[1:]...)) })
	}
	h.release()
	works[0], errs[0] = h.work, h.err
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

// A batch of ends commits together, and each caller gets its own outcome:
// a lost claim fails only its Finish (ErrWorkLost), a commit callback's
// error only its own (the Work stays open), and the others commit, with
// their callbacks.
func TestBatchedEndsFailOnlyTheirOwnCaller(t *testing.T) {
	e, _, s := batchEnv(t)
	const n = 8
	machines := make([]uuid.UUID, n+1)
	for i := range machines {
		machines[i] = e.machine()
	}
	works, err := s.WorkMany(context.Background(), "install", n+1, retrieveAll(machines...))
	if err != nil || len(works) != n+1 {
		t.Fatalf("WorkMany = %d works, %v", len(works), err)
	}
	lost, bad, failed := works[1], works[2], works[3]
	e.exec("DELETE FROM work WHERE machine_id = $1", lost.Machine())
	errBad := errors.New("tag table refused it")

	h := holdBatch(t, s, e.machine())
	errs := make([]error, len(works))
	for i, w := range works {
		h.queue(func() {
			switch w {
			case bad:
				errs[i] = w.Finish(context.Background(), func(*Tx) error { return errBad })
			case failed:
				errs[i] = w.Fail(context.Background(), &testBackoff, "flaky BMC")
			default:
				errs[i] = w.Finish(context.Background(), tagCommit(w.Machine()))
			}
		})
	}
	h.release()

	for i, w := range works {
		switch {
		case w == lost:
			if !errors.Is(errs[i], ErrWorkLost) {
				t.Errorf("Finish of the lost claim = %v, want ErrWorkLost", errs[i])
			}
		case w == bad:
			if !errors.Is(errs[i], errBad) || !strings.Contains(errs[i].Error(), bad.Machine().String()) {
				t.Errorf("Finish with a failing commit = %v, want its error, naming the machine", errs[i])
			}
		case errs[i] != nil:
			t.Errorf("end of %s: %v", w.Machine(), errs[i])
		case w != failed && !e.tagged(w.Machine()):
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
	if n := e.count("SELECT count(*) FROM work_backoff WHERE machine_id = $1 AND cause = 'flaky BMC'", failed.Machine()); n != 1 {
		t.Errorf("the failed Work has %d backoffs, want 1", n)
	}
	// Finished: all but the lost, failing and failed ones, then the retried
	// one.
	if got, want := e.count("SELECT count(*) FROM work_history WHERE session_id = $1 AND event = 'Finished'", s.ID()), len(works)-3+1; got != want {
		t.Errorf("%d Finished rows, want %d", got, want)
	}
}

// A call whose context ends while it is queued leaves the queue with the
// context's error and claims nothing.
func TestQueuedCallLeavesOnCancel(t *testing.T) {
	e, _, s := batchEnv(t)
	a, b := e.machine(), e.machine()
	h := holdBatch(t, s, a)
	ctx, cancel := context.WithCancel(context.Background())
	var queuedErr error
	h.queue(func() { _, queuedErr = s.Work(ctx, "install", retrieveAll(b)) })
	cancel()
	eventually(t, 5*time.Second, "the second claim gone", func() bool { return queued(s, "install") == 0 })
	h.release()
	if h.err != nil || h.work.Machine() != a {
		t.Fatalf("first Work = %v, %v", h.work, h.err)
	}
	if !errors.Is(queuedErr, context.Canceled) {
		t.Errorf("canceled queued Work = %v, want context.Canceled", queuedErr)
	}
	if n := e.count("SELECT count(*) FROM work WHERE machine_id = $1", b); n != 0 {
		t.Errorf("the canceled Work claimed its machine")
	}
}

// Close racing an open batch: the batch's transaction and the calls queued
// behind it fail with ErrSessionClosed, and nothing they claimed stays.
func TestCloseRacingABatch(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open(func(c *Config) { c.SessionInterval, c.MaxConcurrentBatches = 2*time.Second, 1 })
	exact(c) // choreographed: no injected failures in cockroach mode
	s, err := c.StartSession(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	machines := make([]uuid.UUID, 5)
	for i := range machines {
		machines[i] = e.machine()
	}
	h := holdBatch(t, s, machines[0])
	errs := make([]error, len(machines))
	for i := 1; i < len(machines); i++ {
		h.queue(func() { _, errs[i] = s.Work(context.Background(), "install", retrieveAll(machines...)) })
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close(context.Background()) }()
	eventually(t, 5*time.Second, "the session closing", func() bool { return s.Err() != nil })
	h.release()
	errs[0] = h.err
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
		t.Errorf("%d Started rows committed by a closed session's batch", n)
	}
}

// CommitShared: one SharedCommit call commits every Work of the batch that
// passes it; if it fails, the Works are finished one at a time, so that
// only the one it refuses fails.
func TestFinishCommitBatched(t *testing.T) {
	e, _, s := batchEnv(t)
	machines := make([]uuid.UUID, 6)
	for i := range machines {
		machines[i] = e.machine()
	}
	works, err := s.WorkMany(context.Background(), "install", len(machines), retrieveAll(machines...))
	if err != nil || len(works) != len(machines) {
		t.Fatalf("WorkMany = %d works, %v", len(works), err)
	}
	bad := works[len(works)-1].Machine()
	errBad := errors.New("refused")
	g := NewSharedCommit(func(tx *Tx, ws []*Work) error {
		var ids []uuid.UUID
		for _, w := range ws {
			if w.Machine() == bad {
				return errBad
			}
			ids = append(ids, w.Machine())
		}
		for _, id := range ids {
			if err := tagCommit(id)(tx); err != nil {
				return err
			}
		}
		return nil
	})
	h := holdBatch(t, s, e.machine())
	errs := make([]error, len(works))
	h.queue(func() { errs[0] = works[0].Finish(context.Background(), tagCommit(works[0].Machine())) })
	for i, w := range works[1:] {
		h.queue(func() { errs[i+1] = w.Finish(context.Background(), nil, CommitShared(g)) })
	}
	h.release()
	for i, w := range works {
		switch {
		case w.Machine() == bad:
			if !errors.Is(errs[i], errBad) || e.tagged(bad) {
				t.Errorf("batched Finish refused by the SharedCommit = %v (tagged %v), want its error and no tag", errs[i], e.tagged(bad))
			}
		case errs[i] != nil || !e.tagged(w.Machine()):
			t.Errorf("Finish of %s = %v (tagged %v)", w.Machine(), errs[i], e.tagged(w.Machine()))
		}
	}
	if err := works[len(works)-1].Cancel(context.Background()); err != nil {
		t.Errorf("the refused Work is not open: Cancel = %v", err)
	}
	for name, finish := range map[string]func() error{
		"nil SharedCommit":        func() error { return works[0].Finish(context.Background(), nil, CommitShared(nil)) },
		"commit and SharedCommit": func() error { return works[0].Finish(context.Background(), noCommit, CommitShared(g)) },
		"no commit":               func() error { return works[0].Finish(context.Background(), nil) },
	} {
		if err := finish(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Finish with %s = %v, want ErrInvalidArgument", name, err)
		}
	}
}

// A batch whose transaction fails for one call's retrieve runs again
// without it; a call with nothing to do must still get ErrNothingToDo.
func TestIsolatedRetryKeepsNothingToDo(t *testing.T) {
	e, _, s := batchEnv(t)
	h := holdBatch(t, s, e.machine())
	boom := errors.New("boom")
	var bad, empty error
	var emptyWorks []*Work
	h.queue(
		func() {
			_, bad = s.Work(context.Background(), "install", func(*Tx) ([]uuid.UUID, error) { return nil, boom })
		},
		func() {
			emptyWorks, empty = s.WorkMany(context.Background(), "install", 1, func(*Tx) ([]uuid.UUID, error) { return nil, nil })
		})
	h.release()
	if !errors.Is(bad, boom) {
		t.Errorf("the failing retrieve's Work = %v, want its error", bad)
	}
	if !errors.Is(empty, ErrNothingToDo) {
		t.Errorf("WorkMany with nothing = %d works, %v; want ErrNothingToDo", len(emptyWorks), empty)
	}
}

// A call whose own ctx ends while its batch runs, and whose retrieve
// queries with that ctx (as the package example does), must not fail the
// other calls of its batch.
func TestOneCallersContextFailsOnlyItsClaim(t *testing.T) {
	e, _, s := batchEnv(t)
	b, d := e.machine(), e.machine()
	h := holdBatch(t, s, e.machine())
	ctxB, cancelB := context.WithCancel(context.Background())
	inB := newLatch()
	defer inB.open()
	var errB, errC error
	h.queue(
		func() {
			_, errB = s.Work(ctxB, "install", func(tx *Tx) ([]uuid.UUID, error) {
				inB.wait()
				var one int
				if err := tx.DBTX().QueryRowContext(ctxB, "SELECT 1").Scan(&one); err != nil {
					return nil, err
				}
				return []uuid.UUID{b}, nil
			})
		},
		func() { _, errC = s.Work(context.Background(), "install", retrieveAll(d)) })
	h.releaseCanceling(inB, cancelB)
	if errC != nil || !errors.Is(errB, context.Canceled) {
		t.Errorf("B (ctx ended) = %v, C = %v; want context.Canceled and nil", errB, errC)
	}
}

// Two Works of one session on the same machine (the first's end committed
// ambiguously, the machine was claimed again): ending both in one batch
// must not report the stale one as ended, nor write two history rows.
func TestStaleAndNewClaimOfAMachineInOneBatch(t *testing.T) {
	e, _, s := batchEnv(t)
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
	var e1, e2 error
	behindHeldClaim(t, s, e.machine(),
		func() { e1 = w1.Fail(context.Background(), nil, "stale") },
		func() { e2 = w2.Fail(context.Background(), nil, "fresh") })()
	n := e.count("SELECT count(*) FROM work_history WHERE claim_id = $1 AND event = 'Failed'", w2.ClaimID())
	if !errors.Is(e1, ErrWorkLost) || e2 != nil || n != 1 {
		t.Errorf("stale Work's Fail = %v (want ErrWorkLost), new one's = %v; %d Failed rows for the new claim (want 1)", e1, e2, n)
	}
}

// The same for ends: a Finish whose commit queries with its own ended ctx
// fails alone.
func TestOneCallersContextFailsOnlyItsFinish(t *testing.T) {
	e, _, s := batchEnv(t)
	ms := []uuid.UUID{e.machine(), e.machine()}
	works, err := s.WorkMany(context.Background(), "install", 2, retrieveAll(ms...))
	if err != nil || len(works) != 2 {
		t.Fatal(err)
	}
	h := holdBatch(t, s, e.machine())
	ctxB, cancelB := context.WithCancel(context.Background())
	inB := newLatch()
	defer inB.open()
	var errB, errC error
	h.queue(
		func() {
			errB = works[0].Finish(ctxB, func(tx *Tx) error {
				inB.wait()
				_, err := tx.DBTX().ExecContext(ctxB, "SELECT 1")
				return err
			})
		},
		func() { errC = works[1].Finish(context.Background(), func(*Tx) error { return nil }) })
	h.releaseCanceling(inB, cancelB)
	if errC != nil || !errors.Is(errB, context.Canceled) {
		t.Errorf("B's Finish (ctx ended) = %v, C's = %v; want context.Canceled and nil", errB, errC)
	}
}

// A session's end and Work calls for one process that wait together
// share one transaction, the end first: a machine canceled is free for
// the claim (a machine finished is not: the retrieval, run before the
// Finish's commit, did not see its result), and a failing commit callback
// fails only its Finish while the claim that shared its batch still
// commits.
func TestEndsAndClaimsShareATransaction(t *testing.T) {
	e, c, s := batchEnv(t)
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

	// Cancel a, and claim a again in the same transaction: it is free by
	// the time the claim runs.
	o := run(func(ctx context.Context) error { return wa.Cancel(ctx) }, retrieveAll(a))
	if o.finishErr != nil || o.claimErr != nil {
		t.Fatalf("Cancel: %v; Work: %v", o.finishErr, o.claimErr)
	}
	wb := o.claimed
	if wb.Machine() != a {
		t.Fatalf("claimed %s, want %s claimed again after its Cancel", wb.Machine(), a)
	}
	if o.attempts != 1 { // after the held claim's attempt, one for both
		t.Errorf("%d transaction attempts, want 1: the Cancel and the Work in one", o.attempts)
	}
	if got := e.events(a, s); !slicesEqual(got, "install:Started@1", "install:Canceled@1", "install:Started@1") {
		t.Errorf("history of a = %v", got)
	}
	// Finish a, and ask for a again in the same transaction: its result is
	// committed, and the claim does not take it again.
	o = run(func(ctx context.Context) error { return wb.Finish(ctx, tagCommit(a)) }, retrieveAll(a))
	if o.finishErr != nil || o.claimErr == nil || !e.tagged(a) {
		t.Fatalf("Finish: %v; Work: %v, %v (tagged: %v); want the Finish, and no claim of a", o.finishErr, o.claimed, o.claimErr, e.tagged(a))
	}
	if wb, err = s.Work(context.Background(), "install", retrieveAll(b)); err != nil {
		t.Fatal(err)
	}
	e.exec("DELETE FROM tag WHERE machine_id = $1", a)

	// A failing commit callback fails only its Finish; the Work of the
	// same batch claims a.
	boom := errors.New("boom")
	o = run(func(ctx context.Context) error {
		return wb.Finish(ctx, func(*Tx) error { return boom })
	}, retrieveAll(a))
	if !errors.Is(o.finishErr, boom) || o.claimErr != nil || o.claimed.Machine() != a {
		t.Fatalf("Finish: %v (want boom); Work: %v, %v (want a)", o.finishErr, o.claimed, o.claimErr)
	}
	if n := e.count("SELECT count(*) FROM work WHERE machine_id = $1", b); n != 1 {
		t.Errorf("b has %d claims after its Finish failed, want 1 (still held)", n)
	}
	if err := wb.Finish(context.Background(), noCommit); err != nil {
		t.Errorf("Finish after the failed one: %v", err)
	}
}

// When the COMMIT of a batch of an end and a claim is ambiguous and the
// claim is found held, the transaction committed: the Finish returns nil,
// not ErrAmbiguousCommit, and the Work its machine.
func TestAmbiguousBatchWithAClaimHeldCommittedItsEnds(t *testing.T) {
	e := newWorkEnv(t)
	// A long interval: no heartbeat commits while the hook is armed.
	c := e.open(withMode(crdbmode.Settings{}), func(c *Config) { c.SessionInterval, c.MaxConcurrentBatches = time.Minute, 1 }) // PostgreSQL's commit (the hook)
	var armed atomic.Bool
	var pass atomic.Int32 // commits let through while armed
	c.runner.Hooks.Commit = func(tx *sql.Tx) error {
		if err := tx.Commit(); err != nil || !armed.Load() || pass.Add(-1) >= 0 {
			return err
		}
		armed.Store(false)
		return io.ErrUnexpectedEOF // committed, but the answer was lost
	}
	s := e.session(c)
	a, b, x := e.machine(), e.machine(), e.machine()
	e.fence("install", a, b, x)
	wa, err := s.Work(context.Background(), "install", retrieveAll(a))
	if err != nil {
		t.Fatal(err)
	}
	var finishErr, claimErr error
	var wb *Work
	release := behindHeldClaim(t, s, x,
		func() { finishErr = wa.Finish(context.Background(), tagCommit(a)) },
		func() { wb, claimErr = s.Work(context.Background(), "install", retrieveAll(b)) })
	pass.Store(1) // the held claim's commit, then the batch's
	armed.Store(true)
	release()
	if armed.Load() {
		t.Fatal("the batch's COMMIT was not made ambiguous")
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

// A panic in one caller's callback is that caller's: it panics on its own
// goroutine with the same value, its batch's attempt rolls back, and the
// other calls of the batch run again and commit. The batcher goes on.
func TestPanickingCallbackPanicsOnlyItsCaller(t *testing.T) {
	e, _, s := batchEnv(t)
	a, b, d, x := e.machine(), e.machine(), e.machine(), e.machine()
	wd, err := s.Work(context.Background(), "install", retrieveAll(d))
	if err != nil {
		t.Fatal(err)
	}
	var claimPanic, commitPanic any
	var wb *Work
	var errB, errD error
	catch := func(p *any, fn func()) func() {
		return func() {
			defer func() { *p = recover() }()
			fn()
		}
	}
	behindHeldClaim(t, s, x,
		catch(&claimPanic, func() {
			_, _ = s.Work(context.Background(), "install", func(*Tx) ([]uuid.UUID, error) { panic("retrieve blew up") })
		}),
		func() { wb, errB = s.Work(context.Background(), "install", retrieveAll(a, b)) },
		catch(&commitPanic, func() {
			errD = wd.Finish(context.Background(), func(*Tx) error { panic("commit blew up") })
		}),
	)()
	if claimPanic != "retrieve blew up" || commitPanic != "commit blew up" {
		t.Errorf("callers' panics = %v, %v; want their own callbacks' values", claimPanic, commitPanic)
	}
	if errB != nil || wb.Machine() != a {
		t.Fatalf("the other Work of the batch = %v, %v; want a", wb, errB)
	}
	if errD != nil {
		t.Errorf("the panicking Finish returned %v", errD)
	}
	if n := e.count("SELECT count(*) FROM work WHERE machine_id = $1", d); n != 1 {
		t.Errorf("the Work whose commit panicked is not open (%d claims)", n)
	}
	// The batcher goes on.
	if err := wd.Finish(context.Background(), tagCommit(d)); err != nil || !e.tagged(d) {
		t.Errorf("Finish after the panic = %v (tagged %v)", err, e.tagged(d))
	}
}

// A session starts one goroutine, its heartbeat, and Close waits for it:
// its claims and ends run on their callers' goroutines. After Close,
// calls get its error. Not parallel, so that the goroutines it counts are
// its own.
func TestCloseLeavesNoGoroutine(t *testing.T) {
	e := serialEnv(t)
	c := e.open(func(c *Config) { c.SessionInterval = 10 * time.Second })
	exact(c)
	before := goleak.IgnoreCurrent()
	s, err := c.StartSession(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var works []*Work
	for range 3 {
		w, err := s.Work(context.Background(), "install", retrieveAll(e.machine()))
		if err != nil {
			t.Fatal(err)
		}
		works = append(works, w)
	}
	if err := works[0].Finish(context.Background(), noCommit); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := goleak.Find(before); err != nil {
		t.Errorf("goroutines left after Close: %v", err)
	}
	if _, err := s.Work(context.Background(), "install", retrieveAll(e.machine())); !errors.Is(err, ErrSessionClosed) {
		t.Errorf("Work after Close = %v, want ErrSessionClosed", err)
	}
	if err := works[1].Finish(context.Background(), noCommit); !errors.Is(err, ErrSessionClosed) {
		t.Errorf("Finish after Close = %v, want ErrSessionClosed", err)
	}
}

// Two calls of one batch with the same candidate: one claims it, the other
// gets ErrWorkConflict (the machine is claimed), not ErrNothingToDo.
func TestBatchSiblingsCandidateIsAConflict(t *testing.T) {
	e, _, s := batchEnv(t)
	m := e.machine()
	var errs [2]error
	behindHeldClaim(t, s, e.machine(),
		func() { _, errs[0] = s.Work(context.Background(), "install", retrieveAll(m)) },
		func() { _, errs[1] = s.Work(context.Background(), "install", retrieveAll(m)) })()
	ok, conflict := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, ErrWorkConflict):
			conflict++
		}
	}
	if ok != 1 || conflict != 1 {
		t.Errorf("two claims of one machine in a batch = %v, want one claim and one ErrWorkConflict", errs)
	}
}
