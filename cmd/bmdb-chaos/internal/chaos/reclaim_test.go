package chaos

import (
	"testing"
	"time"

	"github.com/google/uuid"
)

// The free count follows each item's creation, claims, backoffs and
// effect, and none() gives the windows in which no item was free.
func TestFreeWindows(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	a, b := uuid.New(), uuid.New()
	claimA1, claimA2, claimB := uuid.New(), uuid.New(), uuid.New()
	// a: created at 0, claimed 100-300 (Failed, backoff to 500), claimed
	// 600-800 (Finished, done). b: created at 200, claimed 250-900
	// (Abandoned), never done.
	events := []dbEvent{
		{machine: a, claim: claimA1, event: "Started", commit: at(100)},
		{machine: a, claim: claimA1, event: "Failed", commit: at(300), xid: "7"},
		{machine: a, claim: claimA2, event: "Started", commit: at(600)},
		{machine: a, claim: claimA2, event: "Finished", commit: at(800)},
		{machine: b, claim: claimB, event: "Started", commit: at(250)},
		{machine: b, claim: claimB, event: "Abandoned", commit: at(900)},
	}
	created := map[uuid.UUID]time.Time{a: at(0), b: at(200)}
	done := map[uuid.UUID]time.Time{a: at(800)}
	until := map[backoffKey]time.Time{{a, "7"}: at(500)}
	// Free: a 0-100 and 500-600; b 200-250 and from 900 on.
	want := outageWindows{{time.Time{}, at(0)}, {at(100), at(200)}, {at(250), at(500)}, {at(600), at(900)}}
	got := freeWindows(created, done, until, events).none()
	if len(got) != len(want) {
		t.Fatalf("none free in %v, want %v", got, want)
	}
	for i := range want {
		if !got[i][0].Equal(want[i][0]) || !got[i][1].Equal(want[i][1]) {
			t.Errorf("window %d: %v, want %v", i, got[i], want[i])
		}
	}
}

// A dead claim's reclaim runs from its session's final deadline to the
// machine's next Started, less the time no machine was free; claims of
// sessions without a recorded deadline are reported.
func TestReclaims(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	m, dead, live, lost := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	events := []dbEvent{
		{machine: m, session: dead, event: "Started", commit: at(0)},
		{machine: m, session: dead, claim: uuid.New(), event: "Abandoned", commit: at(1500)},
		{machine: m, session: live, event: "Started", commit: at(1800)},
		{machine: m, session: live, event: "Finished", commit: at(2000)},
		{machine: m, session: lost, event: "Started", commit: at(3000)},
		{machine: m, session: lost, claim: uuid.New(), event: "Abandoned", commit: at(4000)},
	}
	final := map[uuid.UUID]time.Time{dead: at(1000)}
	noneFree := outageWindows{{at(1200), at(1500)}}
	rs, unknown := reclaims(events, final, noneFree)
	if len(rs) != 1 || rs[0].machine != m || rs[0].session != dead || !rs[0].deadline.Equal(at(1000)) || !rs[0].started.Equal(at(1800)) {
		t.Fatalf("reclaims %+v, want the dead session's claim, from its deadline to the next Started", rs)
	}
	if rs[0].counted != 500*time.Millisecond {
		t.Errorf("counted %v, want 800ms less the 300ms none was free", rs[0].counted)
	}
	if len(unknown) != 1 || unknown[0] != events[5].claim {
		t.Errorf("unknown %v, want the claim of the session without a deadline", unknown)
	}
}

// A liveness bound is widened by the outages in its window and by the
// delays the workers measured there, except during faults aimed at them.
func TestLivenessAllowance(t *testing.T) {
	offset := int64(0) // database times and the histories' clock agree here
	t0 := time.Unix(1000, 0)
	mono := func(ms int) int64 { return t0.Add(time.Duration(ms) * time.Millisecond).UnixNano() }
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ops := []*op{
		{record: record{Kind: opSched, Call: mono(0), Return: mono(250), Late: int64(20 * time.Millisecond)}, Worker: 0},
		{record: record{Kind: opSched, Call: mono(250), Return: mono(500), Late: int64(40 * time.Millisecond)}, Worker: 1},
		{record: record{Kind: opPing, Call: mono(300), Return: mono(400), Late: int64(100 * time.Millisecond)}, Worker: 0},
		// Worker 2 was stopped: its lateness is the fault's.
		{record: record{Kind: opSched, Call: mono(250), Return: mono(3000), Late: int64(2750 * time.Millisecond)}, Worker: 2},
		{record: record{Kind: opConnect, Call: mono(600), Return: mono(900), Late: int64(300 * time.Millisecond)}, Worker: 1},
		{record: record{Kind: opPing, Call: mono(5000), Return: mono(5010), Late: int64(10 * time.Millisecond)}, Worker: 0},
	}
	faults := []workerWindow{{worker: 2, from: at(200), to: at(2900)}}
	lb := &liveness{outages: outageWindows{{at(100), at(200)}}, delays: newDelays(ops, faults, offset), resume: resumeAfter(time.Second)}
	got, why := lb.allowed(time.Second, at(0), at(1000))
	// The outage, and the fleet's resuming after it (resumeAfter).
	want := time.Second + 100*time.Millisecond + time.Second + pollMax + 250*time.Millisecond + wakeUps*40*time.Millisecond + roundTrips*100*time.Millisecond + 300*time.Millisecond
	if got != want {
		t.Errorf("allowed %v (%s), want %v", got, why, want)
	}
	if got, _ := lb.allowed(time.Second, at(4000), at(4500)); got != time.Second {
		t.Errorf("allowed %v over a window with nothing measured, want the bound", got)
	}
}

// Windows whose measured delays are more than a heartbeat can absorb are
// overloaded, and count as outages; the others only widen the bound.
func TestOverloaded(t *testing.T) {
	t0 := time.Unix(1000, 0)
	mono := func(ms int) int64 { return t0.Add(time.Duration(ms) * time.Millisecond).UnixNano() }
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ops := []*op{
		// Busy but alive: 3 x 100ms + 50ms < 500ms.
		{record: record{Kind: opPing, Call: mono(0), Return: mono(100), Late: int64(100 * time.Millisecond)}},
		{record: record{Kind: opSched, Call: mono(0), Return: mono(250), Late: int64(50 * time.Millisecond)}},
		// Overloaded: 3 x 200ms >= 500ms, in the windows at 500 and 750.
		{record: record{Kind: opPing, Call: mono(600), Return: mono(800), Late: int64(200 * time.Millisecond)}},
		{record: record{Kind: opSched, Call: mono(1000), Return: mono(1250), Late: int64(10 * time.Millisecond)}},
	}
	d := newDelays(ops, nil, 0)
	got := d.overloaded(500 * time.Millisecond)
	if len(got) != 1 || !got[0][0].Equal(at(500)) || !got[0][1].Equal(at(1000)) {
		t.Fatalf("overloaded %v, want the windows at 500 and 750 ms, merged", got)
	}
	u := union(outageWindows{{at(900), at(1100)}}, got)
	if len(u) != 1 || !u[0][0].Equal(at(500)) || !u[0][1].Equal(at(1100)) || u.total() != 600*time.Millisecond {
		t.Errorf("union %v (total %v), want 500-1100 ms", u, u.total())
	}
}

// A session that expired with no fault aimed at its worker marks the half
// interval before its end as overloaded; one expired during a fault on its
// worker, or closed, does not.
func TestSelfExpired(t *testing.T) {
	t0 := time.Unix(1000, 0)
	mono := func(ms int) int64 { return t0.Add(time.Duration(ms) * time.Millisecond).UnixNano() }
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	expired := "bmdb: session expired: no successful heartbeat for 1s (local deadline)"
	ops := []*op{
		{record: record{Kind: opSessionEnd, Return: mono(2000), Out: outExpired, Err: expired}, Worker: 0},
		{record: record{Kind: opSessionEnd, Return: mono(5000), Out: outExpired, Err: expired}, Worker: 1},
		{record: record{Kind: opSessionEnd, Return: mono(8000), Out: outExpired, Err: "bmdb: session closed"}, Worker: 2},
	}
	faults := []workerWindow{{worker: 1, from: at(3000), to: at(4800)}}
	w, n := selfExpired(ops, faults, 0, 500*time.Millisecond)
	if n != 1 || len(w) != 1 || !w[0][0].Equal(at(1500)) || !w[0][1].Equal(at(2000)) {
		t.Errorf("selfExpired = %v, %d; want worker 0's death alone, 1500-2000 ms", w, n)
	}
}
