package bmdb

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// Fleet controls (issue 26): pauses and caps, enforced by the claim
// statement, on every Connection at once.

// steady is a Connection option for these tests: a session interval long
// enough that a loaded machine does not expire sessions by accident (the
// tests that need an expiry force it in the database).
func steady(c *Config) { c.SessionInterval = 10 * time.Second }

// operator is steady, for the operator's Connection.
func operator(c *Config) { steady(c); c.ComponentName = "operator" }

// claimAll runs goroutines Work-then-Finish loops on each of sessions,
// each holding its claim for hold, until the retrieval finds nothing to do
// or the process is paused; a call that finds the cap reached or its
// candidates taken looks again after a millisecond. onClaim, if not nil,
// runs after each claim. It returns when every loop has.
func claimAll(t *testing.T, sessions []*Session, goroutines int, hold time.Duration, onClaim func()) {
	var wg sync.WaitGroup
	for _, s := range sessions {
		for range goroutines {
			wg.Go(func() {
				for {
					w, err := s.Work(context.Background(), "install", retrieveUnclaimed)
					switch {
					case errors.Is(err, ErrCapReached), errors.Is(err, ErrWorkConflict):
						time.Sleep(time.Millisecond)
						continue
					case errors.Is(err, ErrNothingToDo): // ErrProcessPaused too
						return
					case err != nil:
						t.Errorf("Work: %v", err)
						return
					}
					if onClaim != nil {
						onClaim()
					}
					time.Sleep(hold)
					if err := w.Finish(context.Background(), tagCommit(w.Machine())); err != nil {
						t.Errorf("Finish: %v", err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
}

// A pause stops claims on every Connection from the moment it commits,
// while claims held end normally (Finish, Fail, Cancel); a second pause
// and a resume of a running process change nothing and say so; resume
// lets claims start again; each change is recorded with who and why.
func TestPauseAndResume(t *testing.T) {
	e := newWorkEnv(t)
	c1, c2 := e.open(steady), e.open(operator)
	s1, op := e.session(c1), e.session(c2)
	ms := []uuid.UUID{e.machine(), e.machine(), e.machine(), e.machine()}
	held := make([]*Work, 3)
	for i := range held {
		w, err := s1.Work(context.Background(), "install", retrieveAll(ms[i]))
		if err != nil {
			t.Fatal(err)
		}
		held[i] = w
	}

	if changed, err := op.PauseProcess(context.Background(), "install", ControlChange{By: "alice", Reason: "bad image"}); err != nil || !changed {
		t.Fatalf("PauseProcess = %v, %v; want true, nil", changed, err)
	}
	if changed, err := op.PauseProcess(context.Background(), "install", ControlChange{Reason: "again"}); err != nil || changed {
		t.Fatalf("second PauseProcess = %v, %v; want false, nil", changed, err)
	}
	for _, s := range []*Session{s1, op} {
		_, err := s.Work(context.Background(), "install", retrieveAll(ms[3]))
		if !errors.Is(err, ErrProcessPaused) || !errors.Is(err, ErrNothingToDo) {
			t.Errorf("Work of a paused process = %v, want ErrProcessPaused (an ErrNothingToDo)", err)
		}
		if ws, err := s.WorkMany(context.Background(), "install", 2, retrieveAll(ms[3])); !errors.Is(err, ErrProcessPaused) {
			t.Errorf("WorkMany of a paused process = %v, %v; want ErrProcessPaused", ws, err)
		}
	}
	// Another process is not paused.
	if w, err := s1.Work(context.Background(), "burn-in", retrieveAll(ms[3])); err != nil {
		t.Errorf("Work of another process = %v", err)
	} else if err := w.Cancel(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Claims held end normally.
	if err := held[0].Finish(context.Background(), tagCommit(ms[0])); err != nil {
		t.Errorf("Finish while paused: %v", err)
	}
	if err := held[1].Fail(context.Background(), nil, "cause"); err != nil {
		t.Errorf("Fail while paused: %v", err)
	}
	if err := held[2].Cancel(context.Background()); err != nil {
		t.Errorf("Cancel while paused: %v", err)
	}
	if st := c1.Stats(); st.ClaimPaused != 2 || st.ClaimNothingToDo != 0 {
		t.Errorf("stats %+v: want 2 paused calls, no nothing-to-do", st)
	}

	if changed, err := op.ResumeProcess(context.Background(), "install", ControlChange{Reason: "fixed"}); err != nil || !changed {
		t.Fatalf("ResumeProcess = %v, %v; want true, nil", changed, err)
	}
	if changed, err := op.ResumeProcess(context.Background(), "install", ControlChange{Reason: "again"}); err != nil || changed {
		t.Fatalf("second ResumeProcess = %v, %v; want false, nil", changed, err)
	}
	w, err := s1.Work(context.Background(), "install", retrieveAll(ms[3]))
	if err != nil {
		t.Fatalf("Work after resume: %v", err)
	}
	if err := w.Finish(context.Background(), tagCommit(ms[3])); err != nil {
		t.Fatal(err)
	}

	var actions []string
	rows, err := e.db.Query(`SELECT action || ':' || actor || ':' || reason FROM process_control_history
		WHERE process = 'install' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var a string
		if err := rows.Scan(&a); err != nil {
			t.Fatal(err)
		}
		actions = append(actions, a)
	}
	if !slicesEqual(actions, "pause:alice:bad image", "resume:operator:fixed") {
		t.Errorf("control history = %v", actions)
	}
}

// From the moment a pause commits no claim commits: with claims racing on
// several Connections, no Started row is dated after the pause's change,
// and none is committed after it returned; claims held then end normally.
func TestPauseIsExactUnderRacingClaims(t *testing.T) {
	e := newWorkEnv(t)
	const k, goroutines, machines = 3, 3, 400
	for range machines {
		e.machine()
	}
	sessions := make([]*Session, k)
	for i := range sessions {
		sessions[i] = e.session(e.open(steady))
	}
	op := e.session(e.open(operator))
	var paused atomic.Bool
	var claimedAfter atomic.Int64 // Work calls that returned a claim after PauseProcess returned
	racing := make(chan struct{})
	go func() {
		defer close(racing)
		claimAll(t, sessions, goroutines, 0, func() {
			if paused.Load() {
				claimedAfter.Add(1) // the claim may have committed before: checked below
			}
		})
	}()
	eventually(t, 20*time.Second, "some machines done", func() bool { return e.count("SELECT count(*) FROM tag") >= 20 })
	if _, err := op.PauseProcess(context.Background(), "install", ControlChange{Reason: "incident"}); err != nil {
		t.Fatal(err)
	}
	paused.Store(true)
	var returnedAt time.Time
	if err := e.db.QueryRow("SELECT clock_timestamp()").Scan(&returnedAt); err != nil {
		t.Fatal(err)
	}
	<-racing
	var pausedAt time.Time
	if err := e.db.QueryRow("SELECT changed_at FROM process_controls WHERE process = 'install'").Scan(&pausedAt); err != nil {
		t.Fatal(err)
	}
	// On PostgreSQL a claim waits for the pause (FOR SHARE) and is dated
	// before its change; on CockroachDB a claim that read the controls
	// before the change is serialized before it and may be dated after it,
	// but not after PauseProcess returned (it waits such claims out).
	exactFrom, what := pausedAt, "the pause's change"
	if testdb.Cockroach() || testdb.CockroachMode() {
		exactFrom, what = returnedAt, "PauseProcess returned"
	}
	if n := e.count("SELECT count(*) FROM work_history WHERE process = 'install' AND event = 'Started' AND at >= $1", exactFrom); n != 0 {
		t.Errorf("%d claims started at or after %s", n, what)
	}
	if n := e.count("SELECT count(*) FROM work"); n != 0 {
		t.Errorf("%d claims left: every held claim should have finished", n)
	}
	done := e.count("SELECT count(*) FROM tag")
	t.Logf("%d machines done before the pause; %d Work calls returned after PauseProcess returned, their claims made before", done, claimedAfter.Load())
	if done >= machines {
		t.Fatalf("every machine was done before the pause: the test did not race it")
	}
}

// With a cap of N, never more than N claims of the process are live, on
// every Connection together: a sampler of the work table, and the claims'
// intervals in the history (no instant inside more than N of them). A
// claim that finds no free slot gets ErrCapReached, counted apart from
// ErrNothingToDo.
func TestCapLimitsLiveClaimsFleetWide(t *testing.T) {
	e := newWorkEnv(t)
	const k, goroutines, machines, limit = 3, 4, 150, 3
	for range machines {
		e.machine()
	}
	op := e.session(e.open(operator))
	if changed, err := op.CapProcess(context.Background(), "install", limit, ControlChange{Reason: "image servers"}); err != nil || !changed {
		t.Fatalf("CapProcess = %v, %v", changed, err)
	}
	if changed, err := op.CapProcess(context.Background(), "install", limit, ControlChange{Reason: "again"}); err != nil || changed {
		t.Fatalf("same CapProcess again = %v, %v; want false, nil", changed, err)
	}
	conns := make([]*Connection, k)
	sessions := make([]*Session, k)
	for i := range conns {
		conns[i] = e.open(steady)
		sessions[i] = e.session(conns[i])
	}
	stop := make(chan struct{})
	var most atomic.Int64
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			n := int64(e.count("SELECT count(*) FROM work WHERE process = 'install'"))
			if n > most.Load() {
				most.Store(n)
			}
		}
	})
	claimAll(t, sessions, goroutines, 2*time.Millisecond, nil)
	close(stop)
	sampler.Wait()
	if n := e.count("SELECT count(*) FROM tag"); n != machines {
		t.Fatalf("%d machines done, want %d", n, machines)
	}
	if m := most.Load(); m > limit {
		t.Errorf("sampled %d live claims, cap %d", m, limit)
	}
	if depth := historyDepth(t, e, "install"); depth > limit || depth < 2 {
		t.Errorf("claims' intervals overlap %d deep, want 2..%d", depth, limit)
	}
	var capped int64
	for _, c := range conns {
		capped += c.Stats().ClaimCapped
	}
	if capped == 0 {
		t.Errorf("no Work found the cap reached: the test did not press on it")
	}
}

// historyDepth returns the most claims of process whose history intervals
// (Started to their end) contain one instant.
func historyDepth(t *testing.T, e *env, process string) int {
	t.Helper()
	rows, err := e.db.Query(`SELECT s.at, e.at FROM work_history s
		JOIN work_history e ON e.claim_id = s.claim_id AND e.event <> 'Started'
		WHERE s.process = $1 AND s.event = 'Started'`, process)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for rows.Next() {
		var start, end time.Time
		if err := rows.Scan(&start, &end); err != nil {
			t.Fatal(err)
		}
		edges = append(edges, edge{start, 1}, edge{end, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if !edges[i].at.Equal(edges[j].at) {
			return edges[i].at.Before(edges[j].at)
		}
		return edges[i].delta < edges[j].delta // an end before a start at the same instant
	})
	depth, most := 0, 0
	for _, ed := range edges {
		depth += ed.delta
		most = max(most, depth)
	}
	return most
}

// Lowering the cap below the live claims lets them end normally and admits
// a new claim only once fewer than the new cap are live (and none holds a
// slot at or above it); an Abandoned claim frees its slot; removing the
// cap admits claims again.
func TestLoweredCapAndAbandonedSlots(t *testing.T) {
	e := newWorkEnv(t)
	op := e.session(e.open(operator))
	s := e.session(e.open(steady))
	if _, err := op.CapProcess(context.Background(), "install", 5, ControlChange{}); err != nil {
		t.Fatal(err)
	}
	var works []*Work
	for range 5 {
		w, err := s.Work(context.Background(), "install", retrieveAll(e.machine()))
		if err != nil {
			t.Fatal(err)
		}
		works = append(works, w)
	}
	spare := e.machine()
	if _, err := s.Work(context.Background(), "install", retrieveAll(spare)); !errors.Is(err, ErrCapReached) {
		t.Fatalf("Work at the cap = %v, want ErrCapReached", err)
	}
	if _, err := op.CapProcess(context.Background(), "install", 2, ControlChange{Reason: "lowered"}); err != nil {
		t.Fatal(err)
	}
	slotOf := func(w *Work) int {
		var slot int
		if err := e.db.QueryRow("SELECT slot FROM work WHERE claim_id = $1", w.ClaimID()).Scan(&slot); err != nil {
			t.Fatal(err)
		}
		return slot
	}
	// End the claims on slots 2..4 first: 2 live, the new cap.
	var low []*Work
	for _, w := range works {
		if slotOf(w) >= 2 {
			if err := w.Finish(context.Background(), tagCommit(w.Machine())); err != nil {
				t.Fatal(err)
			}
		} else {
			low = append(low, w)
		}
	}
	if len(low) != 2 {
		t.Fatalf("%d claims on slots 0 and 1, want 2", len(low))
	}
	if _, err := s.Work(context.Background(), "install", retrieveAll(spare)); !errors.Is(err, ErrCapReached) {
		t.Fatalf("Work with as many live claims as the lowered cap = %v, want ErrCapReached", err)
	}
	if err := low[0].Finish(context.Background(), tagCommit(low[0].Machine())); err != nil {
		t.Fatal(err)
	}
	w, err := s.Work(context.Background(), "install", retrieveAll(spare))
	if err != nil {
		t.Fatalf("Work below the lowered cap: %v", err)
	}
	// Now at the cap (2): an expired session's claim frees its slot once
	// it is Abandoned.
	c2 := e.open(steady)
	s2 := e.session(c2)
	if _, err := s2.Work(context.Background(), "install", retrieveAll(e.machine())); !errors.Is(err, ErrCapReached) {
		t.Fatalf("Work at the lowered cap = %v, want ErrCapReached", err)
	}
	e.expireInDB(s.ID(), time.Minute)
	if _, err := c2.CollectGarbage(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := e.count("SELECT count(*) FROM work_history WHERE claim_id = $1 AND event = 'Abandoned'", w.ClaimID()); n != 1 {
		t.Fatalf("the expired session's claim was not Abandoned")
	}
	w2, err := s2.Work(context.Background(), "install", retrieveAll(e.machine()))
	if err != nil {
		t.Fatalf("Work after an Abandoned claim freed its slot: %v", err)
	}
	if _, err := op.CapProcess(context.Background(), "install", 0, ControlChange{Reason: "no cap"}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := s2.Work(context.Background(), "install", retrieveAll(e.machine())); err != nil {
			t.Fatalf("Work without a cap: %v", err)
		}
	}
	_ = w2
}

// A pause does not stop GC: an expired session's claim of a paused
// process is recorded as Abandoned, and nobody claims the machine again
// until the process is resumed.
func TestPausedProcessTakeoverAbandonsWithoutReclaim(t *testing.T) {
	e := newWorkEnv(t)
	op := e.session(e.open(operator))
	c2 := e.open(steady)
	s1, s2 := e.session(e.open(steady)), e.session(c2)
	m := e.machine()
	if _, err := s1.Work(context.Background(), "install", retrieveAll(m)); err != nil {
		t.Fatal(err)
	}
	if _, err := op.PauseProcess(context.Background(), "install", ControlChange{}); err != nil {
		t.Fatal(err)
	}
	e.expireInDB(s1.ID(), time.Minute)
	if _, err := s2.Work(context.Background(), "install", retrieveAll(m)); !errors.Is(err, ErrProcessPaused) {
		t.Fatalf("Work of a paused process's expired claim = %v, want ErrProcessPaused", err)
	}
	if _, err := c2.CollectGarbage(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := e.events(m, s1, s2); !slicesEqual(got, "install:Started@1", "install:Abandoned@1") {
		t.Fatalf("history = %v, want the claim Abandoned and not claimed again", got)
	}
	if _, err := op.ResumeProcess(context.Background(), "install", ControlChange{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Work(context.Background(), "install", retrieveAll(m)); err != nil {
		t.Fatalf("Work after resume: %v", err)
	}
}

// Bad input to the controls: a bad process name, a cap out of range.
// A process that never claimed may be paused and capped.
func TestControlsRejectBadInput(t *testing.T) {
	e := newWorkEnv(t)
	s := e.session(e.open(steady))
	for _, p := range []string{"", strings.Repeat("p", 129), "a\nb"} {
		if _, err := s.PauseProcess(context.Background(), p, ControlChange{}); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("PauseProcess(%q) = %v, want ErrInvalidArgument", p, err)
		}
	}
	for _, by := range []string{strings.Repeat("b", 129), "a\x00b", "a\xffb"} {
		if _, err := s.PauseProcess(context.Background(), "install", ControlChange{By: by}); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "ControlChange.By") {
			t.Errorf("PauseProcess by %q = %v, want ErrInvalidArgument naming ControlChange.By", by, err)
		}
	}
	for _, n := range []int{-1, MaxCap + 1} {
		if _, err := s.CapProcess(context.Background(), "install", n, ControlChange{}); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "CapProcess") {
			t.Errorf("CapProcess(%d) = %v, want ErrInvalidArgument naming CapProcess", n, err)
		}
	}
	if changed, err := s.CapProcess(context.Background(), "never-claimed", MaxCap, ControlChange{}); err != nil || !changed {
		t.Errorf("CapProcess of a new process = %v, %v", changed, err)
	}
	if changed, err := s.PauseProcess(context.Background(), "never-claimed", ControlChange{}); err != nil || !changed {
		t.Errorf("PauseProcess of a new process = %v, %v", changed, err)
	}
	if n := e.count("SELECT count(*) FROM process_status WHERE process = 'never-claimed' AND paused AND claim_cap = $1", MaxCap); n != 1 {
		t.Errorf("process_status does not show the paused, capped process")
	}
}

// A cap set while claims race, uncapped, on several Connections: claims
// held then drain, and from the cap's commit on, no claim starts while N
// or more others are live (the history's intervals), including the
// claims made before the cap, which it gives slots.
func TestCapSetUnderRacingClaims(t *testing.T) {
	e := newWorkEnv(t)
	const k, goroutines, machines, limit = 3, 3, 300, 2
	for range machines {
		e.machine()
	}
	op := e.session(e.open(operator))
	sessions := make([]*Session, k)
	for i := range sessions {
		sessions[i] = e.session(e.open(steady))
	}
	racing := make(chan struct{})
	go func() {
		defer close(racing)
		claimAll(t, sessions, goroutines, 2*time.Millisecond, nil)
	}()
	eventually(t, 20*time.Second, "claims racing, uncapped", func() bool { return e.count("SELECT count(*) FROM tag") >= 20 })
	if _, err := op.CapProcess(context.Background(), "install", limit, ControlChange{Reason: "mid-run"}); err != nil {
		t.Fatal(err)
	}
	if n := e.count("SELECT count(*) FROM work WHERE process = 'install' AND slot IS NULL"); n != 0 {
		t.Errorf("%d claims without a slot after the cap", n)
	}
	<-racing
	if n := e.count("SELECT count(*) FROM tag"); n != machines {
		t.Fatalf("%d machines done, want %d", n, machines)
	}
	var capAt time.Time
	if err := e.db.QueryRow("SELECT changed_at FROM process_controls WHERE process = 'install'").Scan(&capAt); err != nil {
		t.Fatal(err)
	}
	// For each claim started after the cap: how many claims' intervals
	// (its own included) contain its start.
	var worst int
	err := e.db.QueryRow(`SELECT COALESCE(max(n), 0) FROM (
		SELECT (SELECT count(*) FROM work_history s2
		        JOIN work_history e2 ON e2.claim_id = s2.claim_id AND e2.event <> 'Started'
		        WHERE s2.process = 'install' AND s2.event = 'Started' AND s2.at <= s.at AND e2.at > s.at) AS n
		FROM work_history s WHERE s.process = 'install' AND s.event = 'Started' AND s.at > $1) AS x`, capAt).Scan(&worst)
	if err != nil {
		t.Fatal(err)
	}
	if worst > limit {
		t.Errorf("a claim started after the cap with %d claims live, itself included; cap %d", worst, limit)
	}
	if n := e.count("SELECT count(*) FROM work_history WHERE process = 'install' AND event = 'Started' AND at > $1", capAt); n < 20 {
		t.Errorf("only %d claims after the cap: the test did not run under it", n)
	}
}

// A cap set over claims made without one counts them: they get slots, and
// a new claim waits until the ones above the cap have ended.
func TestCapCountsClaimsMadeBeforeIt(t *testing.T) {
	e := newWorkEnv(t)
	op := e.session(e.open(operator))
	s := e.session(e.open(steady))
	var works []*Work
	for range 3 {
		w, err := s.Work(context.Background(), "install", retrieveAll(e.machine()))
		if err != nil {
			t.Fatal(err)
		}
		works = append(works, w)
	}
	if _, err := op.CapProcess(context.Background(), "install", 2, ControlChange{}); err != nil {
		t.Fatal(err)
	}
	if n := e.count("SELECT count(DISTINCT slot) FROM work WHERE process = 'install' AND slot IS NOT NULL"); n != 3 {
		t.Fatalf("%d distinct slots among the 3 claims held, want 3", n)
	}
	spare := e.machine()
	if _, err := s.Work(context.Background(), "install", retrieveAll(spare)); !errors.Is(err, ErrCapReached) {
		t.Fatalf("Work over the cap = %v, want ErrCapReached", err)
	}
	var above *Work
	for _, w := range works {
		var slot int
		if err := e.db.QueryRow("SELECT slot FROM work WHERE claim_id = $1", w.ClaimID()).Scan(&slot); err != nil {
			t.Fatal(err)
		}
		if slot >= 2 {
			above = w
		}
	}
	if err := above.Finish(context.Background(), tagCommit(above.Machine())); err != nil {
		t.Fatal(err)
	}
	// 2 live, the cap.
	if _, err := s.Work(context.Background(), "install", retrieveAll(spare)); !errors.Is(err, ErrCapReached) {
		t.Fatalf("Work at the cap = %v, want ErrCapReached", err)
	}
	for _, w := range works {
		if w != above {
			if err := w.Finish(context.Background(), tagCommit(w.Machine())); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if _, err := s.Work(context.Background(), "install", retrieveAll(spare)); err != nil {
		t.Fatalf("Work below the cap: %v", err)
	}
}

// DeleteProcessControls deletes a paused, capped process's controls row
// and its slots, records it, and so lifts the pause and the cap: a claim
// held goes on and ends normally, the next claim makes a fresh row
// (running, no cap), and a new cap counts the claims again.
func TestDeleteProcessControls(t *testing.T) {
	e := newWorkEnv(t)
	ctx := context.Background()
	op := e.session(e.open(operator))
	s := e.session(e.open(steady))
	held, err := s.Work(ctx, "install", retrieveAll(e.machine()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.CapProcess(ctx, "install", 2, ControlChange{}); err != nil {
		t.Fatal(err)
	}
	if _, err := op.PauseProcess(ctx, "install", ControlChange{}); err != nil {
		t.Fatal(err)
	}
	m := e.machine()
	if _, err := s.Work(ctx, "install", retrieveAll(m)); !errors.Is(err, ErrProcessPaused) {
		t.Fatalf("Work while paused = %v, want ErrProcessPaused", err)
	}
	deleted, err := op.DeleteProcessControls(ctx, "install", ControlChange{By: "alice", Reason: "retired"})
	if err != nil || !deleted {
		t.Fatalf("DeleteProcessControls = %v, %v; want deleted", deleted, err)
	}
	if n := e.count("SELECT count(*) FROM process_controls WHERE process = 'install'"); n != 0 {
		t.Errorf("%d controls rows left", n)
	}
	if n := e.count("SELECT count(*) FROM process_slots WHERE process = 'install'"); n != 0 {
		t.Errorf("%d slot rows left", n)
	}
	if n := e.count(`SELECT count(*) FROM process_control_history
		WHERE process = 'install' AND action = 'delete' AND claim_cap = 2 AND actor = 'alice' AND reason = 'retired' AND runtime_info <> ''`); n != 1 {
		t.Errorf("the deletion is not recorded with its cap, who and why")
	}
	// The pause and the cap are lifted: claims commit, beyond the old cap.
	var works []*Work
	for _, id := range []uuid.UUID{m, e.machine(), e.machine()} {
		w, err := s.Work(ctx, "install", retrieveAll(id))
		if err != nil {
			t.Fatalf("Work after the deletion: %v", err)
		}
		works = append(works, w)
	}
	if n := e.count("SELECT count(*) FROM process_controls WHERE process = 'install' AND NOT paused AND claim_cap IS NULL"); n != 1 {
		t.Errorf("the next claim did not make a fresh controls row, running without a cap")
	}
	if err := held.Finish(ctx, tagCommit(held.Machine())); err != nil {
		t.Errorf("Finish of a claim held across the deletion: %v", err)
	}
	// A new cap counts the claims held (3): none starts until fewer are.
	if _, err := op.CapProcess(ctx, "install", 3, ControlChange{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Work(ctx, "install", retrieveAll(e.machine())); !errors.Is(err, ErrCapReached) {
		t.Errorf("Work at the new cap = %v, want ErrCapReached", err)
	}
	if err := works[0].Finish(ctx, tagCommit(works[0].Machine())); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Work(ctx, "install", retrieveAll(e.machine())); err != nil {
		t.Errorf("Work below the new cap: %v", err)
	}
	// Nothing to delete: nothing recorded.
	if deleted, err := op.DeleteProcessControls(ctx, "never-claimed", ControlChange{}); err != nil || deleted {
		t.Errorf("DeleteProcessControls of a process without controls = %v, %v", deleted, err)
	}
	if n := e.count("SELECT count(*) FROM process_control_history WHERE process = 'never-claimed'"); n != 0 {
		t.Errorf("a deletion of nothing is recorded")
	}
	for _, p := range []string{"", "a\nb"} {
		if _, err := op.DeleteProcessControls(ctx, p, ControlChange{}); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("DeleteProcessControls(%q) = %v, want ErrInvalidArgument", p, err)
		}
	}
	if _, err := op.DeleteProcessControls(ctx, "install", ControlChange{By: "a\x00b"}); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "ControlChange.By") {
		t.Errorf("DeleteProcessControls by a bad name = %v, want ErrInvalidArgument naming ControlChange.By", err)
	}
}
