package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
	"github.com/bmdb-dev/bmdb/model"
)

// tagged reports whether Finish's commit for m took effect.
func (e *env) tagged(m uuid.UUID) bool {
	e.t.Helper()
	return e.count("SELECT count(*) FROM tag WHERE machine_id = $1", m) == 1
}

// tagCommit is a Finish commit that tags the machine, the application's
// record that the work is done.
func tagCommit(m uuid.UUID) func(*Tx) error {
	return func(tx *Tx) error {
		_, err := tx.DBTX().ExecContext(context.Background(), "INSERT INTO tag VALUES ($1)", m)
		return err
	}
}

func newWorkEnv(t *testing.T) *env {
	e := newEnv(t)
	e.exec("CREATE TABLE tag (machine_id UUID PRIMARY KEY REFERENCES machines ON DELETE CASCADE)")
	// The controls rows of the tests' processes, as a fleet has them after
	// its first claims: a claim that finds its process's missing makes it
	// and runs again, which tests that count transactions would count.
	e.exec("INSERT INTO process_controls (process) VALUES ('install'), ('inventory')")
	return e
}

// Invariant 4 and 5: Work claims, Finish commits the application's result
// with the claim's removal, and history records both.
func TestWorkClaimAndFinish(t *testing.T) {
	e := newWorkEnv(t)
	s := e.session(e.open())
	m := e.machine()

	w, err := s.Work(context.Background(), "install", retrieveIdle("install"))
	if err != nil {
		t.Fatalf("Work: %v", err)
	}
	if w.Machine() != m || w.Process() != "install" || w.Session() != s {
		t.Fatalf("claimed %s/%s", w.Machine(), w.Process())
	}
	row, err := store.New(e.db).WorkGet(context.Background(), store.WorkGetParams{MachineID: m, Process: "install"})
	if err != nil || row.SessionID != s.ID() || row.ClaimID != w.ClaimID() {
		t.Fatalf("work row = %+v, %v", row, err)
	}
	// A claimed machine is not idle any more for that process, but is for
	// another one.
	if _, err := s.Work(context.Background(), "install", retrieveIdle("install")); !errors.Is(err, ErrNothingToDo) {
		t.Errorf("second Work = %v, want ErrNothingToDo", err)
	}
	other, err := s.Work(context.Background(), "inventory", retrieveIdle("inventory"))
	if err != nil || other.Machine() != m {
		t.Fatalf("Work of another process: %v", err)
	}
	if err := w.Finish(context.Background(), tagCommit(m)); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	if !e.tagged(m) {
		t.Error("Finish's commit did not apply")
	}
	if n := e.count("SELECT count(*) FROM work WHERE machine_id = $1 AND process = 'install'", m); n != 0 {
		t.Error("claim survives Finish")
	}
	// A machine's history comes by process, each in the order it happened.
	if got := e.events(m, s); !slicesEqual(got, "install:Started@1", "install:Finished@1", "inventory:Started@1") {
		t.Errorf("history = %v", got)
	}
}

// Invariant 4: two live sessions cannot hold the same (machine, process).
func TestWorkConflictBetweenLiveSessions(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open()
	s1, s2 := e.session(c), e.session(c)
	m := e.machine()
	if _, err := s1.Work(context.Background(), "install", retrieveAll(m)); err != nil {
		t.Fatal(err)
	}
	_, err := s2.Work(context.Background(), "install", retrieveAll(m))
	if !errors.Is(err, ErrWorkConflict) {
		t.Fatalf("Work on a machine held by a live session = %v, want ErrWorkConflict", err)
	}
	if got := e.events(m, s1, s2); !slicesEqual(got, "install:Started@1") {
		t.Errorf("history = %v", got)
	}
	// Candidates are tried in order: a held one is skipped.
	m2 := e.machine()
	w, err := s2.Work(context.Background(), "install", retrieveAll(m, m2))
	if err != nil || w.Machine() != m2 {
		t.Fatalf("Work(m held, m2 free) = %v, %v", w, err)
	}
}

// Invariant 4: many sessions racing for few machines never both win one,
// and the losers get ErrWorkConflict or retry into ErrNothingToDo.
//
// Its sessions are steady (10 s interval): the subject is exclusion, not
// expiry. With 1 s, eight sessions on a loaded machine missed their
// heartbeat deadlines, and a claim taken over from an expired session
// counted, rightly, as a second claim of its machine.
func TestWorkRaceClaimsEachMachineOnce(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open(steady)
	const machines, workers = 5, 8
	for range machines {
		e.machine()
	}
	type result struct {
		w   *Work
		err error
	}
	results := make(chan result, workers)
	for range workers {
		s := e.session(c)
		go func() {
			w, err := s.Work(context.Background(), "install", retrieveIdle("install"))
			results <- result{w, err}
		}()
	}
	won := map[uuid.UUID]int{}
	for range workers {
		r := <-results
		switch {
		case r.err == nil:
			won[r.w.Machine()]++
		case errors.Is(r.err, ErrWorkConflict), errors.Is(r.err, ErrNothingToDo):
		default:
			t.Errorf("Work: %v", r.err)
		}
	}
	for m, n := range won {
		if n != 1 {
			t.Errorf("machine %s claimed %d times", m, n)
		}
	}
	if n := e.count("SELECT count(*) FROM work"); n != len(won) {
		t.Errorf("%d work rows, %d claims reported", n, len(won))
	}
	if len(won) == 0 {
		t.Error("nobody won a claim")
	}
}

// Invariant 4: a claim held by an expired session is taken over in the same
// transaction and recorded as Abandoned; invariant 5: the old holder's
// Finish then fails and its commit does not apply.
func TestWorkTakeOverFromExpiredSession(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open()
	s1, s2 := e.session(c), e.session(c)
	m := e.machine()
	w1, err := s1.Work(context.Background(), "install", retrieveAll(m))
	if err != nil {
		t.Fatal(err)
	}
	e.expireInDB(s1.ID(), time.Millisecond)

	w2, err := s2.Work(context.Background(), "install", retrieveAll(m))
	if err != nil {
		t.Fatalf("Work on a machine held by an expired session: %v", err)
	}
	if got := e.events(m, s1, s2); !slicesEqual(got, "install:Started@1", "install:Abandoned@1", "install:Started@2") {
		t.Errorf("history = %v", got)
	}
	err = w1.Finish(context.Background(), tagCommit(m))
	if !errors.Is(err, ErrSessionExpired) {
		t.Fatalf("stale Finish = %v, want ErrSessionExpired", err)
	}
	if e.tagged(m) {
		t.Fatal("stale Finish's commit applied")
	}
	if err := w1.Cancel(context.Background()); !errors.Is(err, ErrWorkDone) {
		t.Errorf("Cancel after a failed Finish = %v, want ErrWorkDone", err)
	}
	if err := w2.Finish(context.Background(), tagCommit(m)); err != nil {
		t.Fatalf("new holder's Finish: %v", err)
	}
	if !e.tagged(m) {
		t.Fatal("new holder's commit did not apply")
	}
}

// Invariant 5: the fence. A session that is alive but no longer holds its
// claim (here an operator removed it) cannot Finish, Cancel or Fail it.
func TestWorkLostClaimIsFenced(t *testing.T) {
	for _, end := range []struct {
		name string
		end  func(*Work) error
	}{
		{"Finish", func(w *Work) error { return w.Finish(context.Background(), tagCommit(w.Machine())) }},
		{"Cancel", func(w *Work) error { return w.Cancel(context.Background()) }},
		{"Fail", func(w *Work) error { return w.Fail(context.Background(), &testBackoff, "broken") }},
	} {
		t.Run(end.name, func(t *testing.T) {
			e := newWorkEnv(t)
			s := e.session(e.open())
			m := e.machine()
			w, err := s.Work(context.Background(), "install", retrieveAll(m))
			if err != nil {
				t.Fatal(err)
			}
			e.exec("DELETE FROM work WHERE machine_id = $1", m)
			if err := end.end(w); !errors.Is(err, ErrWorkLost) {
				t.Fatalf("%s of a lost claim = %v, want ErrWorkLost", end.name, err)
			}
			if e.tagged(m) || e.count("SELECT count(*) FROM work_backoff") != 0 {
				t.Fatal("a lost claim's end took effect")
			}
			if got := e.events(m, s); !slicesEqual(got, "install:Started@1") {
				t.Errorf("history = %v", got)
			}
			if s.Err() != nil {
				t.Errorf("session ended: %v", s.Err())
			}
		})
	}
}

// A Work ends exactly once: after one successful Finish, Cancel or Fail,
// every one of them returns ErrWorkDone and history has one end event.
func TestWorkEndsExactlyOnce(t *testing.T) {
	ends := map[string]func(*Work) error{
		"Finish": func(w *Work) error { return w.Finish(context.Background(), noCommit) },
		"Cancel": func(w *Work) error { return w.Cancel(context.Background()) },
		"Fail":   func(w *Work) error { return w.Fail(context.Background(), nil, "broken") },
	}
	event := map[string]string{"Finish": "Finished", "Cancel": "Canceled", "Fail": "Failed"}
	for first, end := range ends {
		t.Run(first, func(t *testing.T) {
			e := newWorkEnv(t)
			s := e.session(e.open())
			m := e.machine()
			w, err := s.Work(context.Background(), "install", retrieveAll(m))
			if err != nil {
				t.Fatal(err)
			}
			if err := end(w); err != nil {
				t.Fatalf("%s: %v", first, err)
			}
			for second, again := range ends {
				if err := again(w); !errors.Is(err, ErrWorkDone) {
					t.Errorf("%s after %s = %v, want ErrWorkDone", second, first, err)
				}
			}
			if got := e.events(m, s); !slicesEqual(got, "install:Started@1", "install:"+event[first]+"@1") {
				t.Errorf("history = %v", got)
			}
		})
	}
}

// A failing commit rolls Finish back and leaves the Work open.
func TestFinishCommitErrorLeavesWorkOpen(t *testing.T) {
	e := newWorkEnv(t)
	s := e.session(e.open())
	m := e.machine()
	w, err := s.Work(context.Background(), "install", retrieveAll(m))
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := w.Finish(context.Background(), func(*Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Finish = %v, want boom", err)
	}
	if n := e.count("SELECT count(*) FROM work WHERE machine_id = $1", m); n != 1 {
		t.Fatal("claim removed by a rolled-back Finish")
	}
	if err := w.Fail(context.Background(), nil, "commit failed"); err != nil {
		t.Fatalf("Fail after failed Finish: %v", err)
	}
	rows, _ := e.q.WorkHistoryForMachine(context.Background(), m)
	if len(rows) != 2 || rows[1].Event != model.WorkHistoryEventFailed || rows[1].FailedCause.String != "commit failed" {
		t.Errorf("history = %+v", rows)
	}
}

// Work's errors: nothing to do, unknown machine.
func TestWorkRetrievalOutcomes(t *testing.T) {
	e := newWorkEnv(t)
	s := e.session(e.open())
	if _, err := s.Work(context.Background(), "install", retrieveAll()); !errors.Is(err, ErrNothingToDo) {
		t.Errorf("Work with no candidates = %v, want ErrNothingToDo", err)
	}
	if _, err := s.Work(context.Background(), "install", retrieveAll(uuid.New())); !errors.Is(err, ErrUnknownMachine) {
		t.Errorf("Work on an unknown machine = %v, want ErrUnknownMachine", err)
	}
	boom := errors.New("query failed")
	_, err := s.Work(context.Background(), "install", func(*Tx) ([]uuid.UUID, error) { return nil, boom })
	if !errors.Is(err, boom) {
		t.Errorf("Work with failing retrieve = %v, want it wrapped", err)
	}
	if n := e.count("SELECT count(*) FROM work_history"); n != 0 {
		t.Errorf("%d history rows from failed claims", n)
	}
	// An unknown id among good candidates never claimed (no claim row
	// yet) is skipped: a good one is claimed. (Before, Work failed with
	// ErrUnknownMachine: it looked for unknown ids before making the good
	// ones' claim rows.)
	good := e.machine()
	if w, err := s.Work(context.Background(), "install", retrieveAll(uuid.New(), good)); err != nil || w.Machine() != good {
		t.Errorf("Work on an unknown id and a machine never claimed = %v, %v; want the machine claimed", w, err)
	} else if err := w.Finish(context.Background(), noCommit); err != nil {
		t.Error(err)
	}
}

// A connection failure during the claim's COMMIT leaves its outcome unknown:
// Work finds out whether the claim committed, and returns the Work if it
// did, so that the machine is not left held with nobody working on it.
func TestWorkAmbiguousCommit(t *testing.T) {
	for _, committed := range []bool{true, false} {
		t.Run(map[bool]string{true: "committed", false: "rolled back"}[committed], func(t *testing.T) {
			e := newWorkEnv(t)
			// A long interval: no heartbeat commits while the hook is armed.
			// PostgreSQL's commit (the hook); cockroach mode's commit point
			// is TestCockroachAmbiguousCommit's.
			c := e.open(withMode(crdbmode.Settings{}), func(c *Config) { c.SessionInterval = time.Minute })
			var armed atomic.Bool // only Work's COMMIT
			var once sync.Once
			c.runner.Hooks.Commit = func(tx *sql.Tx) error {
				err := error(nil)
				if !armed.Load() {
					return tx.Commit()
				}
				once.Do(func() {
					if committed {
						err = tx.Commit()
					} else {
						err = tx.Rollback()
					}
					if err == nil {
						err = io.ErrUnexpectedEOF // the answer to COMMIT was lost
					}
				})
				if err != nil {
					return err
				}
				return tx.Commit()
			}
			s := e.session(c)
			m := e.machine()
			armed.Store(true)
			w, err := s.Work(context.Background(), "install", retrieveAll(m))
			armed.Store(false)
			if committed {
				if err != nil || w.Machine() != m {
					t.Fatalf("Work after an ambiguous, committed claim = %v, %v", w, err)
				}
				if err := w.Finish(context.Background(), tagCommit(m)); err != nil {
					t.Fatalf("Finish of the recovered claim: %v", err)
				}
			} else if !errors.Is(err, ErrAmbiguousCommit) {
				t.Fatalf("Work after an ambiguous, rolled-back claim = %v, want ErrAmbiguousCommit", err)
			}
			want := map[bool]int{true: 2, false: 0}[committed]
			if n := e.count("SELECT count(*) FROM work_history WHERE machine_id = $1", m); n != want {
				t.Errorf("%d history rows, want %d", n, want)
			}
		})
	}
}

// Invariant 5, the real race: a Finish already past its session check when
// the session expires and another session takes the claim over must not
// commit. The takeover commits first; the stale Finish then conflicts with
// it, is retried, and fails on its session check.
func TestFinishRacingATakeover(t *testing.T) {
	e := newWorkEnv(t)
	var hold atomic.Pointer[uuid.UUID]
	inside, release := make(chan struct{}), make(chan struct{})
	// A long interval: the heartbeat must not notice the expiry first. The
	// two sessions are two components, each with its connection (one
	// connection runs its claim transactions one at a time).
	c := e.open(func(c *Config) { c.SessionInterval = time.Minute })
	// The takeover waits ~30 s behind the stalled Finish: a 1 s session
	// could expire meanwhile on a loaded machine, or by cockroach mode's
	// injected heartbeat failures.
	other := e.open(steady)
	exact(c)
	exact(other)
	var once sync.Once
	c.leaseHooks.AfterSessionCheck = func(session uuid.UUID) {
		if p := hold.Load(); p != nil && *p == session {
			once.Do(func() {
				close(inside)
				<-release
			})
		}
	}
	s1, s2 := e.session(c), e.session(other)
	m := e.machine()
	w1, err := s1.Work(context.Background(), "install", retrieveAll(m))
	if err != nil {
		t.Fatal(err)
	}
	id := s1.ID()
	hold.Store(&id)
	finished := make(chan error, 1)
	go func() { finished <- w1.Finish(context.Background(), tagCommit(m)) }()
	<-inside // s1's Finish checked its session: alive
	e.expireInDB(s1.ID(), time.Millisecond)
	w2, err := s2.Work(context.Background(), "install", retrieveAll(m))
	if err != nil {
		t.Fatalf("takeover during the stale Finish: %v", err)
	}
	close(release)
	if err := <-finished; !errors.Is(err, ErrSessionExpired) && !errors.Is(err, ErrWorkLost) {
		t.Fatalf("stale Finish = %v, want ErrSessionExpired or ErrWorkLost", err)
	}
	if e.tagged(m) {
		t.Fatal("the stale Finish's commit applied after a takeover")
	}
	if got := e.events(m, s1, s2); !slicesEqual(got, "install:Started@1", "install:Abandoned@1", "install:Started@2") {
		t.Errorf("history = %v", got)
	}
	if err := w2.Finish(context.Background(), tagCommit(m)); err != nil || !e.tagged(m) {
		t.Fatalf("the new holder's Finish: %v", err)
	}
}

// A claim has an identity: a retried end of an old claim (its first COMMIT
// was ambiguous but did commit) cannot end a newer claim of the same
// session on the same machine.
func TestRetriedEndDoesNotEndANewerClaim(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open(withMode(crdbmode.Settings{}), func(c *Config) { c.SessionInterval = time.Minute }) // PostgreSQL's commit (the hook)
	var armed atomic.Bool
	c.runner.Hooks.Commit = func(tx *sql.Tx) error {
		if !armed.CompareAndSwap(true, false) {
			return tx.Commit()
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		return io.ErrUnexpectedEOF // committed, but the answer was lost
	}
	s := e.session(c)
	m := e.machine()
	w1, err := s.Work(context.Background(), "install", retrieveAll(m))
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	if err := w1.Cancel(context.Background()); !errors.Is(err, ErrAmbiguousCommit) {
		t.Fatalf("Cancel with a lost COMMIT answer = %v, want ErrAmbiguousCommit", err)
	}
	w2, err := s.Work(context.Background(), "install", retrieveAll(m))
	if err != nil {
		t.Fatalf("claiming the canceled machine again: %v", err)
	}
	if err := w1.Cancel(context.Background()); !errors.Is(err, ErrWorkLost) {
		t.Fatalf("retried Cancel of the old claim = %v, want ErrWorkLost", err)
	}
	if err := w2.Finish(context.Background(), tagCommit(m)); err != nil {
		t.Fatalf("Finish of the newer claim: %v", err)
	}
	if got := e.events(m, s); !slicesEqual(got, "install:Started@1", "install:Canceled@1", "install:Started@1", "install:Finished@1") {
		t.Errorf("history = %v", got)
	}
}

// Resolving an ambiguous claim counts only the claims that transaction
// made: if it rolled back and the session claimed the machine meanwhile in
// another transaction, Work must not hand out a second Work for that claim.
// (The other claim is inserted in SQL: a Work of the same session would
// wait for this one's batch.)
func TestAmbiguousClaimDoesNotAdoptAnotherClaim(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open(withMode(crdbmode.Settings{}), func(c *Config) { c.SessionInterval = time.Minute }) // PostgreSQL's commit (the hook)
	s := e.session(c)
	m := e.machine()
	var armed atomic.Bool
	var other uuid.UUID
	c.runner.Hooks.Commit = func(tx *sql.Tx) error {
		if !armed.CompareAndSwap(true, false) {
			return tx.Commit()
		}
		if err := tx.Rollback(); err != nil {
			return err
		}
		if err := e.db.QueryRow("INSERT INTO work (machine_id, process, session_id) VALUES ($1, 'install', $2) RETURNING claim_id",
			m, s.ID()).Scan(&other); err != nil {
			return err
		}
		return io.ErrUnexpectedEOF // rolled back, but the answer was lost
	}
	armed.Store(true)
	w, err := s.Work(context.Background(), "install", retrieveAll(m))
	if !errors.Is(err, ErrAmbiguousCommit) || w != nil {
		t.Fatalf("Work after an ambiguous, rolled-back claim = %v, %v; want ErrAmbiguousCommit and no Work", w, err)
	}
	var held uuid.UUID
	if err := e.db.QueryRow("SELECT claim_id FROM work WHERE machine_id = $1", m).Scan(&held); err != nil || held != other {
		t.Fatalf("work row's claim = %v (%v), want the other claim %v", held, err, other)
	}
}
