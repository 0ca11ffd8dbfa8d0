package bmdb

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
)

// On CockroachDB a locking read locks every row its scan fetches, before
// its filters and LIMIT (cockroach mode's lock at fetch, crdbmode's
// locking.go). A claim must still lock only what it claims: a lone claim
// that offered all its candidates to one statement held them all until it
// committed, and another session claiming from the same candidates found
// none free. Both engines' modes, each version's.

// cockroachLocking opens two Connections in cockroach mode of version v,
// no injected errors, and sessions on them: the first's transactions can
// be held before their COMMIT (gate).
func cockroachLocking(t *testing.T, v crdbmode.Version) (e *env, holder *Session, gate *commitGate, other *Session) {
	e = newEnv(t)
	mode := crdbmode.Settings{Enabled: true, Version: v}
	ca := e.open(withMode(mode), func(c *Config) { c.SessionInterval = 5 * time.Second })
	cb := e.open(withMode(mode), func(c *Config) { c.SessionInterval = 5 * time.Second })
	var id atomic.Pointer[uuid.UUID]
	gate = gateCommits(t, ca, &id)
	holder = e.session(ca)
	hid := holder.ID()
	id.Store(&hid)
	return e, holder, gate, e.session(cb)
}

func TestCockroachClaimLocksOnlyWhatItTakes(t *testing.T) {
	for _, v := range []crdbmode.Version{crdbmode.VersionOldest, crdbmode.VersionNewest} {
		t.Run(v.String(), func(t *testing.T) {
			e, holder, gate, other := cockroachLocking(t, v)
			var ids []uuid.UUID
			for range 20 {
				ids = append(ids, e.machine())
			}
			e.fence("install", ids...)
			// The holder claims one machine and stays before its COMMIT.
			held := workAsync(holder, retrieveAll(ids...))
			<-gate.held
			// Another session, the same candidates: 19 are free.
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			start := time.Now()
			w, err := other.Work(ctx, "install", retrieveAll(ids...))
			if err != nil {
				t.Fatalf("a claim beside a claim in flight, 19 of 20 candidates free: %v after %v (the claim in flight locked them all)", err, time.Since(start))
			}
			gate.open()
			hw, err := held.wait()
			if err != nil {
				t.Fatalf("the held claim: %v", err)
			}
			if hw.Machine() == w.Machine() {
				t.Fatalf("both claimed %s", w.Machine())
			}
			for _, x := range []*Work{w, hw} {
				if err := x.Finish(context.Background(), noCommit); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// A capped process: the claim in flight holds one slot, and locked only
// that one: another claim takes another slot (it got ErrCapReached while
// nine of ten were free).
func TestCockroachCappedClaimLocksOnlyItsSlot(t *testing.T) {
	for _, v := range []crdbmode.Version{crdbmode.VersionOldest, crdbmode.VersionNewest} {
		t.Run(v.String(), func(t *testing.T) {
			e, holder, gate, other := cockroachLocking(t, v)
			if _, err := other.CapProcess(context.Background(), "install", 10, ControlChange{Reason: "test"}); err != nil {
				t.Fatal(err)
			}
			a, b := e.machine(), e.machine()
			e.fence("install", a, b)
			held := workAsync(holder, retrieveAll(a))
			<-gate.held
			// The other claim may take the slot the claim in flight took
			// (one in ten): the unique key on (process, slot) then makes it
			// wait for that claim, which the test lets commit after a while.
			claim := workAsync(other, retrieveAll(b))
			select {
			case <-claim.done:
			case <-time.After(time.Second):
			}
			gate.open()
			w, err := claim.wait()
			if errors.Is(err, ErrCapReached) {
				t.Fatalf("cap 10, one claim in flight: %v (the claim in flight locked every slot)", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			hw, err := held.wait()
			if err != nil {
				t.Fatalf("the held claim: %v", err)
			}
			if got := e.count("SELECT count(DISTINCT slot) FROM work WHERE process = 'install' AND slot IS NOT NULL"); got != 2 {
				t.Fatalf("%d distinct slots held by 2 claims", got)
			}
			for _, x := range []*Work{w, hw} {
				if err := x.Finish(context.Background(), noCommit); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// On CockroachDB a claim's read of its process's controls row (FOR SHARE)
// is a plain read: a pause does not wait for the claims in flight, which
// are serialized before it and may commit after it. PauseProcess returns
// only once none of them can: here a claim that read the controls before
// the pause stays before its COMMIT until PauseProcess has returned, and
// then cannot commit. (Before, PauseProcess returned at once and the
// claim committed after it.)
func TestCockroachPauseWaitsOutClaimsInFlight(t *testing.T) {
	for _, v := range []crdbmode.Version{crdbmode.VersionOldest, crdbmode.VersionNewest} {
		t.Run(v.String(), func(t *testing.T) { pauseWaitsOutClaimsInFlight(t, v) })
	}
}

func pauseWaitsOutClaimsInFlight(t *testing.T, v crdbmode.Version) {
	e := newEnv(t)
	const maxTx = 400 * time.Millisecond
	mode := crdbmode.Settings{Enabled: true, Version: v}
	cfg := func(c *Config) { c.SessionInterval, c.MaxTransactionDuration = 5*time.Second, maxTx }
	ca, cb := e.open(withMode(mode), cfg), e.open(withMode(mode), cfg)
	var id atomic.Pointer[uuid.UUID]
	gate := gateCommits(t, ca, &id)
	claimer, operator := e.session(ca), e.session(cb)
	cid := claimer.ID()
	id.Store(&cid)
	m := e.machine()
	e.fence("install", m)
	e.exec("INSERT INTO process_controls (process) VALUES ('install')")
	held := workAsync(claimer, retrieveAll(m))
	<-gate.held
	start := time.Now()
	if _, err := operator.PauseProcess(context.Background(), "install", ControlChange{Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	returned := time.Now()
	gate.open()
	_, err := held.wait()
	started := e.count("SELECT count(*) FROM work_history WHERE event = 'Started' AND machine_id = $1", m)
	if err == nil || started != 0 {
		t.Fatalf("a claim that read the controls before the pause committed after PauseProcess returned %v after it started (%v, %d Started rows)",
			returned.Sub(start), err, started)
	}
	if !errors.Is(err, ErrTransactionTooLong) && !errors.Is(err, ErrProcessPaused) {
		t.Errorf("the claim in flight: %v; want it kept from committing", err)
	}
	if took := returned.Sub(start); took < maxTx {
		t.Errorf("PauseProcess returned after %v, before a claim in flight (up to %v) could have ended", took, maxTx)
	}
}

// On CockroachDB each gateway dates rows by its own clock, and clocks
// differ by up to the cluster's maximum offset: a pair's history sorted by
// at can show a claim's Started before the previous claim's Finished.
// Two components, on gateways whose clocks are 600 ms apart, claim and
// finish one machine in turn; its history comes back in the order it
// happened, numbered by the pair's claim row (seq). (Before, it came back
// by at: the second claim's Started before the first's Finished.)
func TestHistoryInTheOrderItHappened(t *testing.T) {
	for _, v := range []crdbmode.Version{crdbmode.VersionOldest, crdbmode.VersionNewest} {
		t.Run(v.String(), func(t *testing.T) { historyInTheOrderItHappened(t, v) })
	}
}

func historyInTheOrderItHappened(t *testing.T, v crdbmode.Version) {
	e := newEnv(t)
	gateway := func(offset time.Duration) *Session {
		mode := crdbmode.Settings{Enabled: true, ClockOffset: offset, Version: v}
		return e.session(e.open(withMode(mode), func(c *Config) {
			c.SessionInterval, c.MaxClockOffset = 5*time.Second, 500*time.Millisecond
		}))
	}
	ahead, behind := gateway(300*time.Millisecond), gateway(-300*time.Millisecond)
	m := e.machine()
	e.fence("install", m)
	for _, s := range []*Session{ahead, behind} {
		w, err := s.Work(context.Background(), "install", retrieveAll(m))
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Finish(context.Background(), noCommit); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := e.q.WorkHistoryForMachine(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var seqs []int64
	for _, r := range rows {
		who := "ahead"
		if r.SessionID == behind.ID() {
			who = "behind"
		}
		got = append(got, string(r.Event)+"@"+who)
		seqs = append(seqs, r.Seq.Int64)
		t.Logf("%s@%s seq %d at %s", r.Event, who, r.Seq.Int64, r.At.Format("15:04:05.000000"))
	}
	if !slicesEqual(got, "Started@ahead", "Finished@ahead", "Started@behind", "Finished@behind") {
		t.Errorf("history = %v (seq %v), want each claim's Started before its Finished, the first claim's before the second's", got, seqs)
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] <= seqs[i-1] {
			t.Errorf("seq %v does not grow", seqs)
		}
	}
	if n := e.count("SELECT count(*) FROM work_history h, work_history h2 WHERE h.machine_id = $1 AND h2.machine_id = $1 AND h.seq < h2.seq AND h.at > h2.at", m); n == 0 {
		t.Log("no two rows dated out of order: the clocks' offset did not show")
	}
}
