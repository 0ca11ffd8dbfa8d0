package worker

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bmdb-dev/bmdb/bmdb"
)

// A Loop whose process is paused claims nothing, waits (counting the
// calls that found the pause), is not idle for StopWhenIdle while paused,
// and picks work up again within one poll of the resume. Its held work
// ends normally.
func TestLoopWaitsOutAPause(t *testing.T) {
	const machines = 300
	e := newEnv(t, machines)
	op, err := e.conn.StartSession(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close(context.Background())
	var gate atomic.Bool // set: the next handler waits for the test, holding its claim
	var held atomic.Int64
	release := make(chan struct{})
	var releaseOnce sync.Once
	open := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(open)
	const pollMax = 50 * time.Millisecond
	l, stop := e.start(Config{
		Concurrency: 3,
		PollMin:     5 * time.Millisecond, PollMax: pollMax,
		StopWhenIdle: 20 * time.Millisecond,
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			if gate.Load() && held.Add(1) == 1 {
				<-release
			}
			time.Sleep(5 * time.Millisecond) // machines are left when the pause comes
			return markDone(w), nil
		},
	})
	defer stop()
	eventually(t, 20*time.Second, "a few machines done", func() bool { return e.count("SELECT count(*) FROM done") >= 5 })
	gate.Store(true)
	eventually(t, 10*time.Second, "a handler holding its claim", func() bool { return held.Load() >= 1 })
	if _, err := op.PauseProcess(context.Background(), process, bmdb.ControlChange{Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	// PauseProcess's promise, on both engines: no claim commits once it
	// has returned. (A claim that read the controls before the pause
	// committed may commit after the pause's changed_at, its transaction's
	// start: on CockroachDB, PauseProcess waits those out before it
	// returns.)
	startedAtPause := e.count("SELECT count(*) FROM work_history WHERE event = 'Started'")
	eventually(t, 10*time.Second, "the loop to find the pause", func() bool { return l.Stats().Paused >= 3 })
	open() // the claims held end normally
	eventually(t, 10*time.Second, "the held claims to end", func() bool { return e.count("SELECT count(*) FROM work") == 0 })
	doneAtPause := e.count("SELECT count(*) FROM done")
	if doneAtPause >= machines {
		t.Fatal("every machine was done before the pause: the test did not pause anything")
	}
	// Paused, with nothing held: a loop that counted this as idle would
	// stop after StopWhenIdle (20 ms); five more claims that find the
	// pause are at least 4 * PollMax/2 = 100 ms of it.
	paused := l.Stats().Paused
	eventually(t, 10*time.Second, "five more claims finding the pause", func() bool { return l.Stats().Paused >= paused+5 })
	if n := e.count("SELECT count(*) FROM work_history WHERE event = 'Started'"); n != startedAtPause {
		t.Errorf("%d claims committed after PauseProcess returned", n-startedAtPause)
	}
	if n := e.count("SELECT count(*) FROM done"); n != doneAtPause {
		t.Errorf("%d machines done while paused, want %d", n, doneAtPause)
	}
	began := time.Now()
	if _, err := op.ResumeProcess(context.Background(), process, bmdb.ControlChange{Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	pausedAtResume := l.Stats().Paused
	eventually(t, 30*time.Second, "a claim after the resume", func() bool {
		return e.count("SELECT count(*) FROM done") > doneAtPause
	})
	took := time.Since(resumed)
	// Within one poll of the resume: the claim in flight when it
	// committed may still find the pause (its snapshot is older), and the
	// claimer's next claim, at most PollMax later, takes work.
	if n := l.Stats().Paused - pausedAtResume; n > 1 {
		t.Errorf("%d claims found the pause after ResumeProcess returned, want at most the one in flight", n)
	}
	// The same in time: that claim, PollMax, the next claim, the work
	// (5 ms) and its Finish, and this test's poll (10 ms). Each of the
	// three transactions is given the time ResumeProcess's own took (a
	// transaction of the same server under the same load) and the
	// test's count query one more; and a second's allowance besides.
	resumeTook := resumed.Sub(began)
	if limit := 2*pollMax + 4*resumeTook + time.Second; took > limit {
		t.Errorf("first machine done %v after the resume, want within %v (PollMax %v, ResumeProcess took %v)", took, limit, pollMax, resumeTook)
	}
	eventually(t, 30*time.Second, "every machine done", func() bool { return e.count("SELECT count(*) FROM done") == machines })
	// A handler counts its Finish once the call returns, a moment after
	// the commit the count above saw.
	eventually(t, 10*time.Second, "every Finish counted", func() bool { return l.Stats().Finished == machines })
	if st := l.Stats(); st.Paused == 0 || st.Finished != machines {
		t.Errorf("stats %+v", st)
	}
}

// A Loop under a cap never holds more claims than the cap, however many
// handlers it has, and counts the calls that found the cap reached.
func TestLoopUnderACap(t *testing.T) {
	e := newEnv(t, 40)
	op, err := e.conn.StartSession(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close(context.Background())
	if _, err := op.CapProcess(context.Background(), process, 2, bmdb.ControlChange{Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	var running, most atomic.Int64
	l, stop := e.start(Config{
		Concurrency: 6,
		PollMin:     time.Millisecond, PollMax: 5 * time.Millisecond,
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			n := running.Add(1)
			defer running.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(3 * time.Millisecond)
			return markDone(w), nil
		},
	})
	defer stop()
	eventually(t, 30*time.Second, "every machine done", func() bool { return e.count("SELECT count(*) FROM done") == 40 })
	if m := most.Load(); m > 2 {
		t.Errorf("%d handlers ran at once under a cap of 2", m)
	}
	if st := l.Stats(); st.Capped == 0 {
		t.Errorf("stats %+v: no claim found the cap reached", st)
	}
}
