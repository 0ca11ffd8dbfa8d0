package bmdb

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"
)

// Work.FinishAndWork: the Finish and the claim of the next machine share
// one transaction, and what happens to the claim never undoes the end.

// fusedEnv is a work env with a session holding a claim of the first of
// machines (fenced), ready to finish it and claim the next.
func fusedEnv(t *testing.T, machines int) (*env, *Session, *Work, []uuid.UUID) {
	e := newWorkEnv(t)
	c := e.open(func(c *Config) { c.SessionInterval = 10 * time.Second })
	exact(c)
	s := e.session(c)
	var ids []uuid.UUID
	for range machines {
		ids = append(ids, e.machine())
	}
	e.fence("install", ids...)
	w, err := s.Work(context.Background(), "install", retrieveAll(ids[0]))
	if err != nil {
		t.Fatal(err)
	}
	return e, s, w, ids
}

// The end and the claim in one transaction: the Finished row and the next
// Started row were written by one.
func TestFinishAndWorkShareATransaction(t *testing.T) {
	e, _, w, ids := fusedEnv(t, 2)
	next, claimErr, err := w.FinishAndWork(context.Background(), tagCommit(ids[0]), retrieveAll(ids[1]))
	if err != nil || claimErr != nil || next == nil || next.Machine() != ids[1] {
		t.Fatalf("FinishAndWork = %v, %v, %v", next, claimErr, err)
	}
	if n := e.count(`SELECT count(DISTINCT `+txKey()+`) FROM work_history
		WHERE (machine_id = $1 AND event = 'Finished') OR (machine_id = $2 AND event = 'Started')`, ids[0], ids[1]); n != 1 {
		t.Errorf("the Finished and the next Started rows were written by %d transactions, want 1", n)
	}
	if !e.tagged(ids[0]) {
		t.Error("the Finish's commit did not apply")
	}
	if err := w.Cancel(context.Background()); !errors.Is(err, ErrWorkDone) {
		t.Errorf("Cancel after FinishAndWork = %v, want ErrWorkDone", err)
	}
	if err := next.Finish(context.Background(), noCommit); err != nil {
		t.Error(err)
	}
}

// A claim part that finds nothing, or only machines others hold, leaves
// the end committed and says why.
func TestFinishAndWorkClaimFindsNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		want error
		held bool // the candidate is held by another session
	}{{"nothing", ErrNothingToDo, false}, {"a conflict", ErrWorkConflict, true}} {
		t.Run(tc.name, func(t *testing.T) {
			e, _, w, ids := fusedEnv(t, 2)
			var candidates []uuid.UUID
			if tc.held {
				other := e.session(e.open())
				if _, err := other.Work(context.Background(), "install", retrieveAll(ids[1])); err != nil {
					t.Fatal(err)
				}
				candidates = ids[1:]
			}
			next, claimErr, err := w.FinishAndWork(context.Background(), tagCommit(ids[0]), retrieveAll(candidates...))
			if err != nil || next != nil || !errors.Is(claimErr, tc.want) {
				t.Fatalf("FinishAndWork = %v, %v, %v; want the end and %v", next, claimErr, err, tc.want)
			}
			if !e.tagged(ids[0]) || e.count("SELECT count(*) FROM work_history WHERE machine_id = $1 AND event = 'Finished'", ids[0]) != 1 {
				t.Error("the end did not commit")
			}
		})
	}
}

// A claim part that meets a claim of an expired session among its
// candidates takes that session over (Abandoned), claims the machine, and
// the end commits with them.
func TestFinishAndWorkTakesOver(t *testing.T) {
	e, s, w, ids := fusedEnv(t, 2)
	dead := e.session(e.open())
	if _, err := dead.Work(context.Background(), "install", retrieveAll(ids[1])); err != nil {
		t.Fatal(err)
	}
	e.expireInDB(dead.ID(), time.Minute)
	next, claimErr, err := w.FinishAndWork(context.Background(), tagCommit(ids[0]), retrieveAll(ids[1]))
	if err != nil || claimErr != nil || next == nil || next.Machine() != ids[1] {
		t.Fatalf("FinishAndWork = %v, %v, %v; want the dead session's machine", next, claimErr, err)
	}
	if got := e.events(ids[1], dead, s); !slicesEqual(got, "install:Started@1", "install:Abandoned@1", "install:Started@2") {
		t.Errorf("history of the taken machine = %v", got)
	}
	if !e.tagged(ids[0]) {
		t.Error("the end did not commit")
	}
}

// An end whose commit callback fails fails alone: its claim part is not
// made either, and the Work stays open; a retrieve that fails leaves the
// end committed, with the error as the claim's.
func TestFinishAndWorkFailures(t *testing.T) {
	t.Run("commit fails", func(t *testing.T) {
		e, _, w, ids := fusedEnv(t, 2)
		boom := errors.New("boom")
		next, claimErr, err := w.FinishAndWork(context.Background(), func(*Tx) error { return boom }, retrieveAll(ids[1]))
		if !errors.Is(err, boom) || next != nil || claimErr != nil {
			t.Fatalf("FinishAndWork = %v, %v, %v; want the commit's error", next, claimErr, err)
		}
		if n := e.count("SELECT count(*) FROM work WHERE machine_id = $1", ids[1]); n != 0 {
			t.Error("the claim part was made though the end failed")
		}
		if err := w.Finish(context.Background(), noCommit); err != nil {
			t.Errorf("the Work after its failed FinishAndWork: %v, want it still open", err)
		}
	})
	t.Run("retrieve fails", func(t *testing.T) {
		e, _, w, ids := fusedEnv(t, 2)
		boom := errors.New("boom")
		var calls atomic.Int32
		next, claimErr, err := w.FinishAndWork(context.Background(), tagCommit(ids[0]), func(*Tx) ([]uuid.UUID, error) {
			calls.Add(1)
			return nil, boom
		})
		if err != nil || next != nil || !errors.Is(claimErr, boom) {
			t.Fatalf("FinishAndWork = %v, %v, %v; want the end, and the retrieve's error as the claim's", next, claimErr, err)
		}
		if !e.tagged(ids[0]) {
			t.Error("the end did not commit")
		}
	})
}

// A Finish whose claim is gone (here removed by hand while the session
// lives; a takeover after its expiry does the same) is lost, and claims
// nothing: no next machine is held with nobody working on it, though the
// claim part ran in the attempt that found the end lost.
func TestFinishAndWorkLostClaimsNothing(t *testing.T) {
	e, _, w, ids := fusedEnv(t, 2)
	e.exec("DELETE FROM work WHERE machine_id = $1", ids[0])
	next, claimErr, err := w.FinishAndWork(context.Background(), tagCommit(ids[0]), retrieveAll(ids[1]))
	if next != nil || claimErr != nil || !errors.Is(err, ErrWorkLost) {
		t.Fatalf("FinishAndWork of a claim gone = %v, %v, %v; want it lost", next, claimErr, err)
	}
	if n := e.count("SELECT count(*) FROM work WHERE machine_id = $1", ids[1]); n != 0 {
		t.Error("a lost Finish claimed a next machine")
	}
	if e.tagged(ids[0]) {
		t.Error("a lost Finish's commit applied")
	}
}

// Every outcome of FinishAndWork at once, in one batch (the calls queued
// behind a held one): a claim part that claims, one that conflicts, one
// that finds nothing, one that takes an expired session over, and an end
// whose commit callback fails. Each call gets its own outcome; none undoes
// another's end or claim.
func TestFinishAndWorkOutcomesInOneBatch(t *testing.T) {
	e, c, s := batchEnv(t)
	ctx := context.Background()
	machine := func(n int) []uuid.UUID {
		var ids []uuid.UUID
		for range n {
			ids = append(ids, e.machine())
		}
		e.fence("install", ids...)
		return ids
	}
	ended, next := machine(5), machine(4)
	x := machine(1)[0] // the held batch's
	var works []*Work
	for _, m := range ended {
		w, err := s.Work(ctx, "install", retrieveAll(m))
		if err != nil {
			t.Fatal(err)
		}
		works = append(works, w)
	}
	other := e.session(c)
	if _, err := other.Work(ctx, "install", retrieveAll(next[1])); err != nil {
		t.Fatal(err)
	}
	dead := e.session(e.open())
	if _, err := dead.Work(ctx, "install", retrieveAll(next[3])); err != nil {
		t.Fatal(err)
	}
	e.expireInDB(dead.ID(), time.Minute)

	boom := errors.New("boom")
	type outcome struct {
		next          *Work
		claimErr, err error
	}
	got := make([]outcome, len(works))
	commits := []func(*Tx) error{
		tagCommit(ended[0]), tagCommit(ended[1]), tagCommit(ended[2]), tagCommit(ended[3]),
		func(*Tx) error { return boom },
	}
	retrievals := [][]uuid.UUID{{next[0]}, {next[1]}, {}, {next[3]}, {next[2]}}
	var calls []func()
	for i, w := range works {
		calls = append(calls, func() {
			n, ce, err := w.FinishAndWork(ctx, commits[i], retrieveAll(retrievals[i]...))
			got[i] = outcome{n, ce, err}
		})
	}
	behindHeldClaim(t, s, x, calls...)()

	if o := got[0]; o.err != nil || o.claimErr != nil || o.next == nil || o.next.Machine() != next[0] {
		t.Errorf("the call that claims: %+v", o)
	}
	if o := got[1]; o.err != nil || o.next != nil || !errors.Is(o.claimErr, ErrWorkConflict) {
		t.Errorf("the call whose candidate another session holds: %+v, want its end and ErrWorkConflict", o)
	}
	if o := got[2]; o.err != nil || o.next != nil || !errors.Is(o.claimErr, ErrNothingToDo) {
		t.Errorf("the call that finds nothing: %+v, want its end and ErrNothingToDo", o)
	}
	if o := got[3]; o.err != nil || o.claimErr != nil || o.next == nil || o.next.Machine() != next[3] {
		t.Errorf("the call that meets an expired claim: %+v, want it taken over", o)
	}
	if o := got[4]; !errors.Is(o.err, boom) || o.next != nil || o.claimErr != nil {
		t.Errorf("the call whose commit fails: %+v, want its error alone", o)
	}
	for i := range 4 {
		if !e.tagged(ended[i]) || e.count("SELECT count(*) FROM work_history WHERE machine_id = $1 AND event = 'Finished'", ended[i]) != 1 {
			t.Errorf("call %d's end did not commit once", i)
		}
	}
	if n := e.count("SELECT count(*) FROM work WHERE machine_id = $1", next[2]); n != 0 {
		t.Error("the failed end's claim part was made")
	}
	if got := e.events(next[3], dead, s); !slicesEqual(got, "install:Started@1", "install:Abandoned@1", "install:Started@2") {
		t.Errorf("history of the machine taken over = %v", got)
	}
	if err := works[4].Finish(ctx, noCommit); err != nil {
		t.Errorf("the Work whose FinishAndWork failed: %v, want it still open", err)
	}
	if sizes := e.startedPerTransaction(s); len(sizes) < 2 {
		t.Errorf("claim transactions %v", sizes)
	}
	if n := e.count(`SELECT count(DISTINCT `+txKey()+`) FROM work_history
		WHERE event = 'Finished' AND machine_id = ANY ($1)`, pq.Array(ended[:4])); n != 1 {
		t.Errorf("the four ends committed in %d transactions, want one batch", n)
	}
}
