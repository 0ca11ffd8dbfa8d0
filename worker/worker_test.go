package worker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/bmdbtest"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

func TestMain(m *testing.M) { os.Exit(bmdbtest.Run(m, nil)) }

const process = "install"

type env struct {
	t    *testing.T
	dsn  string // the test database, as its owner
	db   *sql.DB
	conn *bmdb.Connection
}

// loopApp is the application_name of the loop's connections.
const loopApp = "worker-test-loop"

// envInterval is the session interval of newEnv's Connection. No test of
// the package is about a session expiring by itself: those that need an
// expiry force it in the database (or cut the network of another
// Connection's), so the interval is long enough that a loaded machine
// never expires a session by accident. A heartbeat then has half of it,
// 5 s, to succeed, where 3 s sessions (1.5 s, and 1.25 s in cockroach
// mode) lost their loops' claims under three CPU spinners beside the
// suite. The cost: a session whose expiry a test forces notices it at its
// next heartbeat, up to 5 s later.
const envInterval = 10 * time.Second

// newEnv gives a test its database with a "done" tag table and n machines.

func newEnv(t *testing.T, n int) *env {
	t.Helper()
	t.Parallel()
	dsn := testdb.New(t)
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec("CREATE TABLE done (machine_id UUID PRIMARY KEY REFERENCES machines)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO machines (machine_id) SELECT gen_random_uuid() FROM generate_series(1, $1::INT8)", n); err != nil {
		t.Fatal(err)
	}
	conn, err := bmdb.Open(context.Background(), bmdb.Config{DSN: testdb.WithApplicationName(t, dsn, loopApp), ComponentName: "worker-test", SessionInterval: envInterval, WrapConnector: testdb.WrapConnector()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &env{t: t, dsn: dsn, db: db, conn: conn}
}

func (e *env) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.db.QueryRow(query, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// retrieveNotDone proposes machines without a done tag or a live claim.
func retrieveNotDone(ctx context.Context, tx *bmdb.Tx, limit int32) ([]uuid.UUID, error) {
	rows, err := tx.DBTX().QueryContext(ctx, `
		SELECT m.machine_id FROM machines m
		WHERE NOT EXISTS (SELECT 1 FROM done d WHERE d.machine_id = m.machine_id)
		  AND NOT EXISTS (SELECT 1 FROM work w JOIN sessions s USING (session_id)
		                  WHERE w.machine_id = m.machine_id AND s.deadline > now())
		ORDER BY m.machine_id LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

func markDone(w *bmdb.Work) func(*bmdb.Tx) error {
	return func(tx *bmdb.Tx) error {
		_, err := tx.DBTX().ExecContext(context.Background(), "INSERT INTO done VALUES ($1)", w.Machine())
		return err
	}
}

// start runs a Loop in the background; stop cancels it and returns how long
// Run took to return.
func (e *env) start(cfg Config) (l *Loop, stop func() time.Duration) {
	e.t.Helper()
	cfg.Process = process
	if cfg.Retrieve == nil {
		cfg.Retrieve = retrieveNotDone
	}
	l, err := New(e.conn, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- l.Run(ctx) }()
	var once sync.Once
	var took time.Duration
	stop = func() time.Duration {
		once.Do(func() {
			start := time.Now()
			cancel()
			select {
			case err := <-ran:
				if err != nil {
					e.t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				e.t.Fatal("Run did not return after shutdown")
			}
			took = time.Since(start)
		})
		return took
	}
	e.t.Cleanup(func() { stop() })
	return l, stop
}

// history returns every machine's events, in order, as "Event@n" with
// sessions numbered by first appearance.
func (e *env) history() map[uuid.UUID][]string {
	e.t.Helper()
	rows, err := e.db.Query("SELECT machine_id, session_id, event, coalesce(failed_cause, '') FROM work_history ORDER BY at, id")
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	sessions := map[uuid.UUID]int{}
	out := map[uuid.UUID][]string{}
	for rows.Next() {
		var m, s uuid.UUID
		var event, cause string
		if err := rows.Scan(&m, &s, &event, &cause); err != nil {
			e.t.Fatal(err)
		}
		if _, ok := sessions[s]; !ok {
			sessions[s] = len(sessions) + 1
		}
		out[m] = append(out[m], fmt.Sprintf("%s@%d", event, sessions[s]))
	}
	return out
}

// eventually is testdb.Eventually.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testdb.Eventually(t, timeout, what, cond)
}

func TestLoopProcessesEveryMachineOnce(t *testing.T) {
	const machines, concurrency = 40, 4
	e := newEnv(t, machines)
	var running, peak atomic.Int64
	l, stop := e.start(Config{
		Concurrency: concurrency,
		PollMin:     10 * time.Millisecond,
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			n := running.Add(1)
			defer running.Add(-1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			time.Sleep(5 * time.Millisecond) // simulated work
			return markDone(w), nil
		},
	})
	eventually(t, 20*time.Second, "every machine done", func() bool {
		return e.count("SELECT count(*) FROM done") == machines
	})
	stop()

	for m, events := range e.history() {
		if len(events) != 2 || !strings.HasPrefix(events[0], "Started") || !strings.HasPrefix(events[1], "Finished") {
			t.Errorf("machine %s: history %v, want one Started and one Finished", m, events)
		}
	}
	if p := peak.Load(); p > concurrency || p < 2 {
		t.Errorf("peak concurrency %d, want 2..%d", p, concurrency)
	}
	st := l.Stats()
	if st.Finished != machines || st.Claimed != machines || st.Failed+st.Canceled+st.Lost != 0 {
		t.Errorf("stats %+v", st)
	}
	if n := e.count("SELECT count(*) FROM sessions") + e.count("SELECT count(*) FROM work"); n != 0 {
		t.Errorf("%d session or work rows left after shutdown", n)
	}
}

func TestLoopFailsWithBackoffThenSucceeds(t *testing.T) {
	e := newEnv(t, 5)
	var mu sync.Mutex
	tried := map[uuid.UUID]bool{}
	l, stop := e.start(Config{
		Concurrency: 2,
		PollMin:     10 * time.Millisecond,
		PollMax:     50 * time.Millisecond,
		Backoff:     bmdb.Backoff{Initial: 200 * time.Millisecond, Maximum: time.Second, Exponent: 2},
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			mu.Lock()
			defer mu.Unlock()
			if !tried[w.Machine()] {
				tried[w.Machine()] = true
				return nil, errors.New("BMC did not answer")
			}
			return markDone(w), nil
		},
	})
	eventually(t, 20*time.Second, "every machine done", func() bool { return e.count("SELECT count(*) FROM done") == 5 })
	stop()
	for m, events := range e.history() {
		if !slices.Equal(events, []string{"Started@1", "Failed@1", "Started@1", "Finished@1"}) {
			t.Errorf("machine %s: history %v", m, events)
		}
	}
	if n := e.count("SELECT count(*) FROM work_history WHERE event = 'Failed' AND failed_cause = 'BMC did not answer'"); n != 5 {
		t.Errorf("%d failures recorded with their cause, want 5", n)
	}
	// The retry waited out the backoff on the database clock.
	if n := e.count(`SELECT count(*) FROM work_history f JOIN work_history s
		ON s.machine_id = f.machine_id AND s.event = 'Started' AND s.at > f.at
		WHERE f.event = 'Failed' AND s.at - f.at < INTERVAL '200 milliseconds'`); n != 0 {
		t.Errorf("%d machines reclaimed before their backoff ended", n)
	}
	if n := e.count("SELECT count(*) FROM work_backoff"); n != 0 {
		t.Errorf("%d backoffs left after Finish", n)
	}
	if st := l.Stats(); st.Failed != 5 || st.Finished != 5 {
		t.Errorf("stats %+v", st)
	}
}

func TestLoopShutdownCancelsWorkAfterGrace(t *testing.T) {
	e := newEnv(t, 2)
	const grace = 300 * time.Millisecond
	var sawCause atomic.Value
	var cutAt atomic.Int64 // when Work saw its context end, Unix nanoseconds
	working := make(chan struct{}, 2)
	l, stop := e.start(Config{
		Concurrency:   2,
		PollMin:       10 * time.Millisecond,
		ShutdownGrace: grace,
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			working <- struct{}{}
			<-ctx.Done() // work that outlasts any grace period
			cutAt.Store(time.Now().UnixNano())
			sawCause.Store(context.Cause(ctx))
			return nil, ctx.Err()
		},
	})
	// Both handlers at work (a claim row alone is not enough: a handler
	// that sees shutdown before its Work starts gives the claim back
	// unworked, at once).
	for range 2 {
		select {
		case <-working:
		case <-time.After(30 * time.Second):
			t.Fatal("Work did not start on both machines")
		}
	}
	probe := testdb.StartDelayProbe(t)
	begun := time.Now()
	took := stop()
	late := probe.Stop()
	if c, _ := sawCause.Load().(error); !errors.Is(c, errShutdown) {
		t.Fatalf("work context cause = %v", c)
	}
	// The work is cut off at the grace, not before; after it by no more
	// than the wake-ups between the shutdown, the grace's timer and the
	// handler (a few goroutine hops, each at most the worst scheduling
	// delay measured meanwhile).
	cut := time.Unix(0, cutAt.Load()).Sub(begun)
	if limit := grace + 4*late + 50*time.Millisecond; cut < grace || cut > limit {
		t.Errorf("work cut off %v after shutdown began, want %v to %v (the grace, and 4 times the worst scheduling delay seen, %v)", cut, grace, limit, late)
	}
	// Run returns once the claims are Canceled and the session closed:
	// each is bounded by ShutdownGrace + 1 s (a Cancel that fails is tried
	// once more with the same bound, then Close cancels it), so Run is
	// back within grace + 3 (grace + 1 s), plus the scheduling delays.
	// Work that is never cut off would keep Run from returning at all.
	if limit := grace + 3*(grace+time.Second) + 4*late; took < grace || took > limit {
		t.Errorf("Run returned %v after shutdown, want %v to %v", took, grace, limit)
	}
	t.Logf("work cut off after %v, Run returned after %v (grace %v, worst scheduling delay %v)", cut.Round(time.Millisecond), took.Round(time.Millisecond), grace, late)
	for m, events := range e.history() {
		if !slices.Equal(events, []string{"Started@1", "Canceled@1"}) {
			t.Errorf("machine %s: history %v", m, events)
		}
	}
	if n := e.count("SELECT count(*) FROM work_backoff") + e.count("SELECT count(*) FROM sessions"); n != 0 {
		t.Errorf("shutdown left %d backoff or session rows", n)
	}
	if st := l.Stats(); st.Canceled != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestLoopShutdownLetsWorkFinishAndStopsClaiming(t *testing.T) {
	e := newEnv(t, 3)
	release := make(chan struct{})
	claimed := make(chan struct{}, 3)
	l, err := New(e.conn, Config{
		Process:       process,
		Retrieve:      retrieveNotDone,
		Concurrency:   1,
		PollMin:       10 * time.Millisecond,
		ShutdownGrace: 10 * time.Second,
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			claimed <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return markDone(w), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- l.Run(ctx) }()
	<-claimed
	cancel() // shutdown begins with work in flight
	close(release)
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after the in-flight work finished")
	}
	if n := e.count("SELECT count(*) FROM done"); n != 1 {
		t.Errorf("%d machines done, want exactly the one in flight at shutdown", n)
	}
	if st := l.Stats(); st.Claimed != 1 || st.Finished != 1 {
		t.Errorf("stats %+v: claims after shutdown began", st)
	}
}

func TestLoopRecoversFromSessionLoss(t *testing.T) {
	e := newEnv(t, 1)
	var attempts atomic.Int64
	l, stop := e.start(Config{
		Concurrency:  1,
		PollMin:      10 * time.Millisecond,
		RestartDelay: 50 * time.Millisecond,
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			if attempts.Add(1) == 1 {
				<-ctx.Done() // the session dies under this work
				if !errors.Is(context.Cause(ctx), bmdb.ErrSessionExpired) {
					return nil, fmt.Errorf("work context ended by %v, not by session expiry", context.Cause(ctx))
				}
				return markDone(w), nil // must not be committed
			}
			return markDone(w), nil
		},
	})
	eventually(t, 10*time.Second, "the first claim", func() bool { return e.count("SELECT count(*) FROM work") == 1 })
	if _, err := e.db.Exec("UPDATE sessions SET deadline = now() - INTERVAL '1 second'"); err != nil {
		t.Fatal(err)
	}
	// The session notices at its next heartbeat, up to envInterval/2 later.
	eventually(t, envInterval+20*time.Second, "the machine done by a new session", func() bool { return e.count("SELECT count(*) FROM done") == 1 })
	stop()
	for m, events := range e.history() {
		if !slices.Equal(events, []string{"Started@1", "Abandoned@1", "Started@2", "Finished@2"}) {
			t.Errorf("machine %s: history %v", m, events)
		}
	}
	if st := l.Stats(); st.Sessions < 2 || st.Lost != 1 || st.Finished != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestLoopIdleDoesNotSpin(t *testing.T) {
	e := newEnv(t, 0)
	const pollMin, pollMax = 20 * time.Millisecond, 100 * time.Millisecond
	l, stop := e.start(Config{
		Concurrency: 4,
		PollMin:     pollMin,
		PollMax:     pollMax,
		Work: func(context.Context, *bmdb.Work) (func(*bmdb.Tx) error, error) {
			return nil, errors.New("nothing should be claimed")
		},
	})
	// The claimer (one for the loop's 4 handlers) waits 20, 40, 80, then
	// 100 ms between claims that find nothing, each jittered down by up
	// to half: from the fourth claim on, consecutive claims are at least
	// pollMax/2 apart. So a window of w holds at most 1 + w/(pollMax/2)
	// claims, however slow the machine (a loaded one makes fewer); a hot
	// loop makes thousands.
	eventually(t, 30*time.Second, "four idle claims", func() bool { return l.Stats().Polls >= 4 })
	from, began := l.Stats().Polls, time.Now()
	time.Sleep(time.Second) // the observation window
	polls, window := l.Stats().Polls-from, time.Since(began)
	if limit := 1 + int64(window/(pollMax/2)); polls > limit {
		t.Errorf("%d claims in %v by an idle loop, want at most %d", polls, window, limit)
	}
	t.Logf("%d claims in %v", polls, window)
	// And it still polls.
	eventually(t, 30*time.Second, "another idle claim", func() bool { return l.Stats().Polls > from+polls })
	stop()
	if st := l.Stats(); st.Sessions != 1 || st.Claimed != 0 {
		t.Errorf("stats %+v, want one session (a new one starts polling at PollMin again) and no claim", st)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	work := func(context.Context, *bmdb.Work) (func(*bmdb.Tx) error, error) { return nil, nil }
	good := Config{Process: process, Retrieve: retrieveNotDone, Work: work}
	conn := &bmdb.Connection{}
	for _, tc := range []struct {
		field string
		mod   func(*Config)
	}{
		{"Process", func(c *Config) { c.Process = "" }},
		{"Process", func(c *Config) { c.Process = strings.Repeat("p", 129) }},
		{"Process", func(c *Config) { c.Process = "a\nb" }},
		{"Process", func(c *Config) { c.Process = "burn in" }},
		{"Retrieve", func(c *Config) { c.Retrieve = nil }},
		{"Work", func(c *Config) { c.Work = nil }},
		{"Concurrency", func(c *Config) { c.Concurrency = -1 }},
		{"Concurrency", func(c *Config) { c.Concurrency = bmdb.MaxWorkMany + 1 }},
		{"Candidates", func(c *Config) { c.Candidates = -1 }},
		{"PollMin", func(c *Config) { c.PollMin = -time.Second }},
		{"PollMax", func(c *Config) { c.PollMin, c.PollMax = time.Second, time.Millisecond }},
		{"ShutdownGrace", func(c *Config) { c.ShutdownGrace = -1 }},
		{"Backoff", func(c *Config) { c.Backoff = bmdb.Backoff{Initial: -1} }},
		{"StopWhenIdle", func(c *Config) { c.StopWhenIdle = -1 }},
		{"DrainTimeout", func(c *Config) { c.StopWhenIdle, c.DrainTimeout = time.Second, -1 }},
		{"DrainTimeout", func(c *Config) { c.DrainTimeout = time.Second }}, // without StopWhenIdle
	} {
		cfg := good
		tc.mod(&cfg)
		if _, err := New(conn, cfg); !errors.Is(err, bmdb.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New with bad %s = %v", tc.field, err)
		}
		// Validate says the same without a Connection, so that a program
		// can check its Config before bmdb.Open touches the database.
		if err := cfg.Validate(); !errors.Is(err, bmdb.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Validate with bad %s = %v", tc.field, err)
		}
	}
	if err := good.Validate(); err != nil {
		t.Errorf("Validate(good) = %v", err)
	}
	if _, err := New(nil, good); !errors.Is(err, bmdb.ErrInvalidArgument) {
		t.Errorf("New(nil conn) = %v", err)
	}
	if _, err := New(conn, good); err != nil {
		t.Errorf("New(good) = %v", err)
	}
}

// Connections killed under a claim (a database restart, pg_terminate_backend)
// do not leave the claim stuck: ending it is retried on new connections.
// The kill comes from inside the first attempt of each Finish, so that a
// transaction of the loop's meets its dead connection (a kill between
// transactions may be noticed by the pool alone, or by a statement that
// is not a transaction's).
func TestLoopSurvivesKilledConnections(t *testing.T) {
	e := newEnv(t, 3)
	// One connection for the test itself: the one that kills the others.
	e.db.SetMaxOpenConns(1)
	killed := atomic.Int64{}
	var mu sync.Mutex
	attempted := map[uuid.UUID]bool{}
	l, stop := e.start(Config{
		Concurrency: 1,
		PollMin:     10 * time.Millisecond,
		Work: func(_ context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			return func(tx *bmdb.Tx) error {
				mu.Lock()
				first := !attempted[w.Machine()]
				attempted[w.Machine()] = true
				mu.Unlock()
				if first {
					// Every connection of the loop to the database, this
					// transaction's among them, as a restart would.
					kctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					n, err := testdb.KillConnections(kctx, e.db, loopApp)
					cancel()
					if err != nil {
						return err
					}
					killed.Add(n)
				}
				return markDone(w)(tx)
			}, nil
		},
	})
	eventually(t, 20*time.Second, "every machine done", func() bool { return e.count("SELECT count(*) FROM done") == 3 })
	stop()
	if killed.Load() == 0 {
		t.Fatal("no connection was killed: the test did not inject the fault")
	}
	for m, events := range e.history() {
		if !slices.Equal(events, []string{"Started@1", "Finished@1"}) {
			t.Errorf("machine %s: history %v", m, events)
		}
	}
	if st := l.Stats(); st.Finished != 3 || st.Lost+st.Failed+st.Canceled != 0 {
		t.Errorf("stats %+v", st)
	}
	if st := e.conn.Stats(); st.TxConnectionRetries < 3 {
		t.Errorf("connection stats %+v: want a connection retry per Finish", st)
	}
}

// Work that completes after the grace period ended its context is still
// finished, not canceled: its result is there to commit.
func TestLoopFinishesWorkThatSucceedsLate(t *testing.T) {
	e := newEnv(t, 1)
	working := make(chan struct{})
	l, stop := e.start(Config{
		PollMin:       10 * time.Millisecond,
		ShutdownGrace: 100 * time.Millisecond,
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			close(working)
			<-ctx.Done() // ignores cancellation, and succeeds anyway
			return markDone(w), nil
		},
	})
	// Work has started (the claim row alone is not enough: a handler that
	// sees shutdown before it starts gives its claim back unworked).
	select {
	case <-working:
	case <-time.After(10 * time.Second):
		t.Fatal("Work did not start")
	}
	stop()
	if n := e.count("SELECT count(*) FROM done"); n != 1 {
		t.Errorf("the late result was not committed")
	}
	if st := l.Stats(); st.Finished != 1 || st.Canceled != 0 {
		t.Errorf("stats %+v", st)
	}
}

// The loop claims for all its free handlers in one transaction, runs the
// handlers in parallel (never more than Concurrency), and bmdb commits their
// concurrent ends together; a failure, and a commit that fails inside a
// batch, still end only their own machine.
func TestLoopBatchesClaimsAndEnds(t *testing.T) {
	e := newEnv(t, 40)
	var mu sync.Mutex
	attempts := map[uuid.UUID]int{}
	var badCommit uuid.UUID // the first machine whose commit fails once
	var running, most atomic.Int64
	l, stop := e.start(Config{
		Concurrency: 8,
		PollMin:     10 * time.Millisecond,
		PollMax:     50 * time.Millisecond,
		Backoff:     bmdb.Backoff{Initial: 50 * time.Millisecond, Maximum: time.Second, Exponent: 2},
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			now := running.Add(1)
			defer running.Add(-1)
			for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
			}
			time.Sleep(20 * time.Millisecond) // the "work": lets handlers overlap
			mu.Lock()
			defer mu.Unlock()
			attempts[w.Machine()]++
			n := attempts[w.Machine()]
			switch {
			case n == 1 && w.Machine()[0]%5 == 0:
				return nil, errors.New("flaky BMC")
			case n == 1 && badCommit == uuid.Nil:
				badCommit = w.Machine()
				return func(*bmdb.Tx) error { return errors.New("tag table refused it") }, nil
			}
			return markDone(w), nil
		},
	})
	eventually(t, 30*time.Second, "every machine done", func() bool { return e.count("SELECT count(*) FROM done") == 40 })
	stop()
	for m, events := range e.history() {
		last := events[len(events)-1]
		if !strings.HasPrefix(last, "Finished") || strings.Count(strings.Join(events, " "), "Finished") != 1 {
			t.Errorf("machine %s: history %v", m, events)
		}
	}
	st := l.Stats()
	if st.Finished != 40 || st.Failed == 0 {
		t.Errorf("stats %+v", st)
	}
	if m := most.Load(); m < 2 || m > 8 {
		t.Errorf("at most %d handlers ran at once, want 2..8", m)
	}
	// Batches: the history rows one transaction wrote (PostgreSQL's xmin,
	// CockroachDB's commit timestamp).
	tx := "xmin::text"
	if testdb.Cockroach() {
		tx = "crdb_internal_mvcc_timestamp"
	}
	for _, event := range []string{"Started", "Finished"} {
		if n := e.count(`SELECT max(c) FROM (SELECT count(*) AS c FROM work_history
			WHERE event = $1 GROUP BY `+tx+`) AS per_transaction`, event); n < 2 || n > 8 {
			t.Errorf("largest transaction wrote %d %s rows, want 2..8", n, event)
		}
	}
	if n := e.count("SELECT count(*) FROM work_history WHERE event = 'Failed' AND failed_cause LIKE 'finish failed:%tag table refused it%'"); n != 1 {
		t.Errorf("%d failures of the bad commit, want 1 (only its own Finish failed)", n)
	}
}

// With Config.CommitShared, the machines whose Work returned no commit are
// committed by one call per batch, with all of its Works.
func TestLoopCommitBatch(t *testing.T) {
	e := newEnv(t, 30)
	var calls, works atomic.Int64
	_, stop := e.start(Config{
		Concurrency: 8,
		PollMin:     10 * time.Millisecond,
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			time.Sleep(5 * time.Millisecond)
			return nil, nil
		},
		CommitShared: func(tx *bmdb.Tx, ws []*bmdb.Work) error {
			calls.Add(1)
			works.Add(int64(len(ws)))
			ids := make([]uuid.UUID, len(ws))
			for i, w := range ws {
				ids[i] = w.Machine()
			}
			_, err := tx.DBTX().ExecContext(context.Background(), "INSERT INTO done SELECT unnest($1::UUID[])", pq.Array(ids))
			return err
		},
	})
	eventually(t, 30*time.Second, "every machine done", func() bool { return e.count("SELECT count(*) FROM done") == 30 })
	stop()
	if n := e.count("SELECT count(*) FROM work_history WHERE event = 'Finished'"); n != 30 {
		t.Errorf("%d Finished rows, want 30", n)
	}
	if c, w := calls.Load(), works.Load(); c >= w || w < 30 {
		t.Errorf("Commit called %d times for %d Works: want fewer calls than Works", c, w)
	}
}

// With one handler, the end of a machine and the claim of the next share a
// transaction: the handler's slot is free once its Work returns, and the
// claimer's WorkMany joins the Finish's batch. About one transaction per
// machine, not two.
func TestLoopEndAndNextClaimShareATransaction(t *testing.T) {
	const n = 30
	e := newEnv(t, n)
	transactions := func() int64 {
		st := e.conn.Stats()
		return st.TxAttempts - st.TxRetries - st.TxConnectionRetries
	}
	before := transactions()
	_, stop := e.start(Config{
		Concurrency: 1,
		PollMin:     time.Millisecond,
		PollMax:     10 * time.Millisecond,
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			return markDone(w), nil
		},
	})
	var used int64
	eventually(t, 30*time.Second, "every machine done", func() bool {
		used = transactions() - before
		return e.count("SELECT count(*) FROM done") == n
	})
	stop()
	t.Logf("%d transactions for %d machines", used, n)
	// n ends with n claims, the session's start and a few polls; separate
	// claim and end transactions would take 2n.
	if used > n*3/2 {
		t.Errorf("%d transactions for %d machines, want about one each (at most %d)", used, n, n*3/2)
	}
}
