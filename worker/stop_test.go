package worker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/bmdbtest"
	"github.com/bmdb-dev/bmdb/internal/testing/netproxy"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// runAsync runs l in the background and returns Run's result channel; the
// run is cancelled at the test's end.
func runAsync(t *testing.T, l *Loop) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ran <- l.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
	return ran
}

// returned waits for Run's result, failing the test after timeout.
func returned(t *testing.T, ran <-chan error, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-ran:
		return err
	case <-time.After(timeout):
		t.Fatalf("Run did not return within %v", timeout)
		return nil
	}
}

// With StopWhenIdle, Run processes every machine and returns once there
// is nothing it can do. A machine in backoff is work left: Run says so,
// with a *LeftError counting it, instead of returning nil.
func TestStopWhenIdle(t *testing.T) {
	e := newEnv(t, 20)
	var failed atomic.Bool
	l, err := New(e.conn, Config{
		Process: process, Retrieve: retrieveNotDone, Concurrency: 4,
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			if failed.CompareAndSwap(false, true) {
				return nil, errors.New("burn-in failed")
			}
			return markDone(w), nil
		},
		Backoff:      bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour, Exponent: 2},
		StopWhenIdle: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = returned(t, runAsync(t, l), 30*time.Second)
	var left *LeftError
	if !errors.As(err, &left) || !errors.Is(err, ErrWorkLeft) {
		t.Fatalf("Run = %v, want a *LeftError", err)
	}
	if left.Process != process || left.InBackoff != 1 || left.ClaimedByOthers != 0 || left.Idle < 300*time.Millisecond {
		t.Errorf("Run = %+v, want 1 machine of %s in backoff, none claimed, after 300ms idle", left, process)
	}
	if want := "worker install: stopped after"; !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "1 machines in backoff, 0 claimed by other sessions") {
		t.Errorf("Run's error says %q", err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("Run returned after %v, before StopWhenIdle", took)
	}
	if n := e.count("SELECT count(*) FROM done"); n != 19 {
		t.Errorf("%d machines done, want 19 (one in backoff)", n)
	}
	if n := e.count("SELECT count(*) FROM work_backoff WHERE until > now()"); n != 1 {
		t.Errorf("%d machines in backoff, want 1", n)
	}
	if n := e.count("SELECT count(*) FROM work"); n != 0 {
		t.Errorf("%d claims left after Run returned", n)
	}
	if n := e.count("SELECT count(*) FROM sessions"); n != 0 {
		t.Errorf("%d sessions left after Run returned", n)
	}
}

// With DrainTimeout, an idle loop waits for machines in backoff and
// retries them when their backoff ends: Run returns nil once every
// machine is done.
func TestStopWhenIdleDrainsBackoffs(t *testing.T) {
	e := newEnv(t, 10)
	var attempted sync.Map // machine -> true
	var failures atomic.Int64
	l, err := New(e.conn, Config{
		Process: process, Retrieve: retrieveNotDone, Concurrency: 4,
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			if _, again := attempted.LoadOrStore(w.Machine(), true); !again && failures.Add(1) <= 3 {
				return nil, errors.New("burn-in failed") // the first attempt of three machines
			}
			return markDone(w), nil
		},
		Backoff: bmdb.Backoff{Initial: 500 * time.Millisecond, Maximum: 500 * time.Millisecond, Exponent: 2},
		PollMin: 10 * time.Millisecond, PollMax: 50 * time.Millisecond,
		StopWhenIdle: 50 * time.Millisecond, DrainTimeout: 20 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := returned(t, runAsync(t, l), 60*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil: the backoffs end within DrainTimeout", err)
	}
	bmdbtest.RequireFinishedOnce(t, e.db, process, e.machines()...)
	if n := e.count("SELECT count(*) FROM work_history WHERE event = 'Failed'"); n != 3 {
		t.Errorf("%d failures, want 3", n)
	}
}

// DrainTimeout bounds the wait: a machine that fails on every attempt,
// with a backoff shorter than DrainTimeout, is retried until the loop has
// finished nothing for DrainTimeout; then Run says it is in backoff.
func TestStopWhenIdleDrainIsBounded(t *testing.T) {
	e := newEnv(t, 2)
	ids := e.machines()
	l, err := New(e.conn, Config{
		Process: process, Retrieve: retrieveNotDone,
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			if w.Machine() == ids[0] {
				return nil, errors.New("burn-in failed")
			}
			return markDone(w), nil
		},
		Backoff: bmdb.Backoff{Initial: 300 * time.Millisecond, Maximum: 300 * time.Millisecond, Exponent: 2},
		PollMin: 10 * time.Millisecond, PollMax: 20 * time.Millisecond,
		StopWhenIdle: 50 * time.Millisecond, DrainTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = returned(t, runAsync(t, l), 60*time.Second)
	var left *LeftError
	if !errors.As(err, &left) || left.InBackoff != 1 || left.ClaimedByOthers != 0 {
		t.Fatalf("Run = %v, want a *LeftError with one machine in backoff", err)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("Run returned after %v, before DrainTimeout", took)
	}
	if n := e.count("SELECT count(*) FROM work_history WHERE event = 'Failed'"); n < 2 {
		t.Errorf("%d failures: the machine was not retried while the loop waited", n)
	}
	// (Its 300ms backoff may have ended since: not RequireInBackoff.)
	if n := e.count("SELECT count(*) FROM work_history WHERE machine_id = $1 AND event = 'Finished'", ids[0]); n != 0 {
		t.Errorf("the failing machine finished %d times", n)
	}
	bmdbtest.RequireFinishedOnce(t, e.db, process, ids[1])
}

// Machines claimed by another session that is alive are work left: a
// loop without DrainTimeout stops and counts them.
func TestStopWhenIdleCountsOthersClaims(t *testing.T) {
	e := newEnv(t, 10)
	ids := e.machines()
	other := e.otherSession(e.dsn, envInterval) // alive throughout
	claim(t, other, ids[:3])
	l, err := New(e.conn, Config{
		Process: process, Retrieve: retrieveNotDone, Concurrency: 4,
		Work:         func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) { return markDone(w), nil },
		StopWhenIdle: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	err = returned(t, runAsync(t, l), 60*time.Second)
	var left *LeftError
	if !errors.As(err, &left) || left.InBackoff != 0 || left.ClaimedByOthers != 3 {
		t.Fatalf("Run = %v, want a *LeftError with 3 machines claimed by others", err)
	}
	bmdbtest.RequireFinishedOnce(t, e.db, process, ids[3:]...)
}

// The case: a copy of the worker killed while it held claims. Its
// session is alive on the database clock until its deadline; with
// DrainTimeout the other copy waits for it to expire, takes the claims
// over, finishes them, and returns nil.
func TestStopWhenIdleDrainsDeadSessionsClaims(t *testing.T) {
	e := newEnv(t, 10)
	ids := e.machines()
	proxy, dsn := netproxy.ForDSN(t, e.dsn)
	dead := e.otherSession(dsn, 2*time.Second) // expires 2 s after the cut
	claim(t, dead, ids[:3])
	proxy.Cut(false) // the copy is gone: no heartbeat reaches the database
	l, err := New(e.conn, Config{
		Process: process, Retrieve: retrieveNotDone, Concurrency: 4,
		Work:    func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) { return markDone(w), nil },
		PollMin: 10 * time.Millisecond, PollMax: 100 * time.Millisecond,
		StopWhenIdle: 100 * time.Millisecond, DrainTimeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := returned(t, runAsync(t, l), 60*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil once the dead session's claims are taken over and finished", err)
	}
	bmdbtest.RequireAbandoned(t, e.db, process, ids[:3]...)
	bmdbtest.RequireFinishedOnce(t, e.db, process, ids...)
}

// machines returns the env's machines, by id.
func (e *env) machines() []uuid.UUID {
	e.t.Helper()
	rows, err := e.db.Query("SELECT machine_id FROM machines ORDER BY machine_id")
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var ids []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			e.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// otherSession starts a session of another component on dsn (the env's
// database), with the given interval, closed at the test's end.
func (e *env) otherSession(dsn string, interval time.Duration) *bmdb.Session {
	e.t.Helper()
	conn, err := bmdb.Open(context.Background(), bmdb.Config{DSN: dsn, ComponentName: "other-copy", SessionInterval: interval, WrapConnector: testdb.WrapConnector()})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close() })
	sess, err := conn.StartSession(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { sess.Close(context.Background()) })
	return sess
}

// claim claims machines for the process on sess.
func claim(t *testing.T, sess *bmdb.Session, machines []uuid.UUID) {
	t.Helper()
	works, err := sess.WorkMany(context.Background(), process, len(machines), func(*bmdb.Tx) ([]uuid.UUID, error) { return machines, nil })
	if err != nil || len(works) != len(machines) {
		t.Fatalf("claiming %d machines: %d claimed, %v", len(machines), len(works), err)
	}
}

// A handler still at work keeps the loop running however long claims find
// nothing; it stops StopWhenIdle after the last handler is done.
func TestStopWhenIdleWaitsForHandlers(t *testing.T) {
	e := newEnv(t, 1)
	release := make(chan struct{})
	working := make(chan struct{})
	l, err := New(e.conn, Config{
		Process: process, Retrieve: retrieveNotDone, Concurrency: 2,
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			close(working)
			<-release
			return markDone(w), nil
		},
		PollMin: 10 * time.Millisecond, PollMax: 20 * time.Millisecond,
		StopWhenIdle: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ran := runAsync(t, l)
	<-working
	// The other handler slot polls and finds nothing, many times over
	// StopWhenIdle: Run must not return while the handler works.
	polls := l.Stats().Polls
	testdb.Eventually(t, 20*time.Second, "20 idle polls", func() bool { return l.Stats().Polls >= polls+20 })
	select {
	case err := <-ran:
		t.Fatalf("Run returned (%v) while a handler was at work", err)
	default:
	}
	close(release)
	if err := returned(t, ran, 20*time.Second); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if n := e.count("SELECT count(*) FROM done"); n != 1 {
		t.Errorf("%d machines done, want 1", n)
	}
}

// Errors no retry can fix end Run with an error wrapping ErrPermanent and
// the database's error, instead of a warning every poll: one case per
// kind, from the retrieval, from a commit, and from a role without rights.
func TestPermanentErrorsEndRun(t *testing.T) {
	retrieving := func(query string) Retrieve {
		return func(ctx context.Context, tx *bmdb.Tx, limit int32) ([]uuid.UUID, error) {
			rows, err := tx.DBTX().QueryContext(ctx, query)
			if err != nil {
				return nil, fmt.Errorf("machines needing burn-in: %w", err)
			}
			defer rows.Close()
			return nil, rows.Err()
		}
	}
	for _, tc := range []struct {
		name     string
		retrieve Retrieve
		commit   string // a statement the commit runs, if not empty
		code     string
		want     string
	}{
		{name: "undefined table", retrieve: retrieving("SELECT machine_id FROM machine_burned_in"), code: "42P01", want: "claiming"},
		{name: "undefined column", retrieve: retrieving("SELECT burned_at FROM machines"), code: "42703", want: "claiming"},
		{name: "syntax error", retrieve: retrieving("SELEC machine_id FROM machines"), code: "42601", want: "claiming"},
		{name: "datatype mismatch", retrieve: retrieving("SELECT CASE WHEN true THEN machine_id ELSE 1 END FROM machines"), code: "42804", want: "claiming"},
		{name: "undefined table in commit", retrieve: retrieveNotDone, commit: "INSERT INTO machine_burned_in VALUES ($1)", code: "42P01", want: "finishing machine"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 1)
			l, err := New(e.conn, Config{
				Process: process, Retrieve: tc.retrieve,
				Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
					return func(tx *bmdb.Tx) error {
						_, err := tx.DBTX().ExecContext(ctx, tc.commit, w.Machine())
						return err
					}, nil
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			err = returned(t, runAsync(t, l), 30*time.Second)
			checkPermanent(t, err, tc.code, "worker "+process+": "+tc.want)
			if tc.commit != "" {
				var m uuid.UUID
				if err := e.db.QueryRow("SELECT machine_id FROM machines").Scan(&m); err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(err.Error(), m.String()) {
					t.Errorf("Run's error does not name the machine %s: %v", m, err)
				}
				if n := e.count("SELECT count(*) FROM work"); n != 0 {
					t.Errorf("the claim is still held after Run returned")
				}
			}
		})
	}
	t.Run("insufficient privilege", func(t *testing.T) {
		testdb.SkipOnCockroach(t, "roles are made with docs/roles.sql's PostgreSQL form here")
		e := newEnv(t, 1)
		role := fmt.Sprintf("bmdb_worker_%d_%d", os.Getpid(), rand.N(1_000_000))
		script, err := os.ReadFile("../docs/roles.sql")
		if err != nil {
			t.Fatal(err)
		}
		admin, err := sql.Open("postgres", testdb.DSN(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.Close() })
		sqlText := strings.NewReplacer("bmdb_worker", role, "bmdb_operator", role+"_op").Replace(string(script))
		// Roles outlive the database: revoke their grants there, then drop them.
		t.Cleanup(func() {
			e.db.Exec(fmt.Sprintf("DROP OWNED BY %s, %s", pq.QuoteIdentifier(role), pq.QuoteIdentifier(role+"_op")))
			admin.Exec(fmt.Sprintf("DROP ROLE IF EXISTS %s, %s", pq.QuoteIdentifier(role), pq.QuoteIdentifier(role+"_op")))
		})
		if _, err := e.db.Exec(sqlText); err != nil {
			t.Fatalf("docs/roles.sql: %v", err)
		}
		// The application's table, without a grant to the worker role.
		if _, err := e.db.Exec("CREATE TABLE machine_burned_in (machine_id UUID PRIMARY KEY)"); err != nil {
			t.Fatal(err)
		}
		u, err := url.Parse(e.dsn)
		if err != nil {
			t.Fatalf("test DSN is not a URL: %v", err)
		}
		u.User = url.UserPassword(role, "worker-password") // the test server trusts local connections
		conn, err := bmdb.Open(context.Background(), bmdb.Config{DSN: u.String(), ComponentName: "burner", SkipMigrations: true, WrapConnector: testdb.WrapConnector()})
		if err != nil {
			t.Fatalf("Open as the worker role: %v", err)
		}
		t.Cleanup(func() { conn.Close() })
		l, err := New(conn, Config{
			Process: process, Retrieve: retrieving("SELECT machine_id FROM machine_burned_in"),
			Work: func(context.Context, *bmdb.Work) (func(*bmdb.Tx) error, error) { return nil, nil },
		})
		if err != nil {
			t.Fatal(err)
		}
		checkPermanent(t, returned(t, runAsync(t, l), 30*time.Second), "42501", "worker "+process+": claiming")
	})
}

// checkPermanent checks that err is Run's error for a permanent database
// error: it wraps ErrPermanent and the driver's error with the given code,
// and says where it came from.
func checkPermanent(t *testing.T, err error, code, want string) {
	t.Helper()
	var pqErr *pq.Error
	switch {
	case !errors.Is(err, ErrPermanent):
		t.Fatalf("Run = %v, want an error wrapping ErrPermanent", err)
	case !errors.As(err, &pqErr) || string(pqErr.Code) != code:
		t.Errorf("Run = %v, want it to wrap a pq error %s", err, code)
	case !bmdb.IsPermanent(err):
		t.Errorf("bmdb.IsPermanent(%v) = false", err)
	case !strings.Contains(err.Error(), want):
		t.Errorf("Run = %v, want it to say %q", err, want)
	}
}
