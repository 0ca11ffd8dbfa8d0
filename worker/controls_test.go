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
	var pausedAt time.Time
	if err := e.db.QueryRow("SELECT changed_at FROM process_controls WHERE process = $1", process).Scan(&pausedAt); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the loop to find the pause", func() bool { return l.Stats().Paused >= 3 })
	open() // the claims held end normally
	eventually(t, 10*time.Second, "the held claims to end", func() bool { return e.count("SELECT count(*) FROM work") == 0 })
	doneAtPause := e.count("SELECT count(*) FROM done")
	if doneAtPause >= machines {
		t.Fatal("every machine was done before the pause: the test did not pause anything")
	}
	time.Sleep(5 * pollMax) // paused: a loop that counted this as idle would stop
	if n := e.count("SELECT count(*) FROM work_history WHERE event = 'Started' AND at >= $1", pausedAt); n != 0 {
		t.Errorf("%d claims started after the pause", n)
	}
	if n := e.count("SELECT count(*) FROM done"); n != doneAtPause {
		t.Errorf("%d machines done while paused, want %d", n, doneAtPause)
	}
	resumed := time.Now()
	if _, err := op.ResumeProcess(context.Background(), process, bmdb.ControlChange{Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "a claim after the resume", func() bool {
		return e.count("SELECT count(*) FROM done") > doneAtPause
	})
	if took := time.Since(resumed); took > 2*pollMax+time.Second {
		t.Errorf("first machine done %v after the resume, PollMax %v", took, pollMax)
	}
	eventually(t, 30*time.Second, "every machine done", func() bool { return e.count("SELECT count(*) FROM done") == machines })
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
