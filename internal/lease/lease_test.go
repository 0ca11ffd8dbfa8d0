package lease

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	_ "github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/internal/counters"
	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/testing/schema"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
	"github.com/bmdb-dev/bmdb/internal/txn"
)

// The lease's own tests: the session row, its heartbeat and local
// deadline, the checks, Close, takeover's core and GC, on PostgreSQL, one
// database per test. What a Session adds on top (the public errors,
// transactions of an application, cockroach mode) is tested in bmdb.

func TestMain(m *testing.M) {
	os.Exit(testdb.Run(m, schema.Up))
}

// newRunner returns a runner on a new database, and the database.
func newRunner(t *testing.T) (*txn.Runner, *sql.DB) {
	t.Helper()
	db, err := sql.Open("postgres", testdb.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &txn.Runner{DB: db, MaxAttempts: 10, MaxAttemptDuration: -1, Counters: &counters.Counters{}}, db
}

// start starts a lease with interval (its lifetime too) and no GC.
func start(t *testing.T, r *txn.Runner, interval time.Duration, hooks *Hooks) *Lease {
	t.Helper()
	l, err := Start(context.Background(), r, nil, Config{
		ComponentName: "lease-test", Interval: interval, Lifetime: interval,
		IdleInTransaction: time.Minute, GCPeriod: time.Hour,
	}, hooks)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !errors.Is(l.Err(), ErrSessionClosed) { // not closed by the test itself
			_, _, _ = l.Close(context.Background())
		}
	})
	return l
}

// dbDeadline returns the session row's deadline less the database's now,
// and whether the row exists.
func dbDeadline(t *testing.T, db *sql.DB, id uuid.UUID) (time.Duration, bool) {
	t.Helper()
	var left float64
	err := db.QueryRow("SELECT extract(epoch FROM deadline - now()) FROM sessions WHERE session_id = $1", id).Scan(&left)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(left * float64(time.Second)), true
}

// The heartbeat keeps the row's deadline about one interval ahead on the
// database clock, and the session alive locally, for several intervals.
func TestHeartbeatKeepsTheSessionAlive(t *testing.T) {
	t.Parallel()
	r, db := newRunner(t)
	const interval = 4 * time.Second // a heartbeat every 2 s, each with 2 s to spare on a loaded machine
	l := start(t, r, interval, nil)
	if left, ok := dbDeadline(t, db, l.ID()); !ok || left <= 0 || left > interval {
		t.Fatalf("after Start: deadline in %v (row %v), want within (0, %v]", left, ok, interval)
	}
	var first time.Time
	if err := db.QueryRow("SELECT deadline FROM sessions WHERE session_id = $1", l.ID()).Scan(&first); err != nil {
		t.Fatal(err)
	}
	// Two intervals: a session that did not beat would have ended.
	end := time.Now().Add(2 * interval)
	for time.Now().Before(end) {
		if err := l.Alive(); err != nil {
			t.Fatalf("%v into the session: %v", 2*interval-time.Until(end), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var last time.Time
	if err := db.QueryRow("SELECT deadline FROM sessions WHERE session_id = $1", l.ID()).Scan(&last); err != nil {
		t.Fatal(err)
	}
	if !last.After(first) {
		t.Errorf("deadline %v not extended from %v", last, first)
	}
	if n := r.Counters.HeartbeatFailures.Load(); n != 0 {
		t.Errorf("%d heartbeat failures", n)
	}
}

// A session whose heartbeats all fail ends at its local deadline (one
// lifetime after its last successful heartbeat's start, here Start's),
// with ErrSessionExpired, and its goroutine returns.
func TestFailingHeartbeatsEndTheSessionAtItsLocalDeadline(t *testing.T) {
	t.Parallel()
	r, _ := newRunner(t)
	const interval = time.Second
	fault := errors.New("injected heartbeat failure")
	began := time.Now()
	l := start(t, r, interval, &Hooks{BeforeHeartbeat: func(context.Context) error { return fault }})
	select {
	case <-l.Done():
	case <-time.After(10 * interval):
		t.Fatal("session still alive 10 intervals after its heartbeats began failing")
	}
	took := time.Since(began)
	if !errors.Is(l.Err(), ErrSessionExpired) || !errors.Is(l.Alive(), ErrSessionExpired) {
		t.Errorf("Err = %v, Alive = %v, want ErrSessionExpired", l.Err(), l.Alive())
	}
	// Never before the local deadline; after it, as late as this
	// machine's scheduling makes it (no upper bound asserted here: bmdb's
	// timing tests measure that).
	if took < interval {
		t.Errorf("ended %v after Start, before its local deadline (%v)", took, interval)
	}
	if n := r.Counters.HeartbeatFailures.Load(); n == 0 {
		t.Error("no heartbeat failure counted")
	}
	if n := r.Counters.SessionsExpired.Load(); n != 1 {
		t.Errorf("SessionsExpired = %d, want 1", n)
	}
}

// Check finds a session the database expired (its row gone or past its
// deadline), ends the session, and says so; a live one passes and counts
// as the attempt's first check.
func TestCheckEndsASessionTheDatabaseExpired(t *testing.T) {
	t.Parallel()
	r, db := newRunner(t)
	l := start(t, r, time.Minute, nil)
	ctx := context.Background()
	err := r.Run(ctx, txn.Serializable, nil, func(tx *txn.Tx) error {
		if err := l.Check(ctx, tx); err != nil {
			return err
		}
		if !tx.EverChecked() {
			t.Error("a passed Check did not count as the attempt's check")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("live session: %v", err)
	}
	if _, err := db.Exec("UPDATE sessions SET deadline = now() - interval '1 second' WHERE session_id = $1", l.ID()); err != nil {
		t.Fatal(err)
	}
	err = r.Run(ctx, txn.Serializable, nil, func(tx *txn.Tx) error { return l.Check(ctx, tx) })
	if !errors.Is(err, ErrSessionExpired) {
		t.Fatalf("expired in the database: Check = %v, want ErrSessionExpired", err)
	}
	if !errors.Is(l.Err(), ErrSessionExpired) {
		t.Errorf("Err = %v, want ErrSessionExpired", l.Err())
	}
	select {
	case <-l.Done():
	case <-time.After(time.Minute):
		t.Fatal("heartbeat goroutine still running after the session ended")
	}
}

// Close stops the heartbeat, waits for it, ends the session's claims as
// Canceled and deletes the row; the session's context ends with
// ErrSessionClosed.
func TestCloseEndsClaimsAndDeletesTheRow(t *testing.T) {
	t.Parallel()
	r, db := newRunner(t)
	l := start(t, r, time.Minute, nil)
	m := uuid.New()
	if _, err := db.Exec("INSERT INTO machines (machine_id) VALUES ($1)", m); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO work (machine_id, process, session_id) VALUES ($1, 'install', $2)", m, l.ID()); err != nil {
		t.Fatal(err)
	}
	event, ended, err := l.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if event != store.WorkHistoryEventCanceled || !slices.Equal(ended, []string{"install"}) {
		t.Errorf("Close = %v %v, want Canceled [install]", event, ended)
	}
	select {
	case <-l.Done():
	default:
		t.Error("Close returned before the heartbeat goroutine")
	}
	if !errors.Is(l.Err(), ErrSessionClosed) || !errors.Is(context.Cause(l.Context()), ErrSessionClosed) {
		t.Errorf("Err = %v, want ErrSessionClosed", l.Err())
	}
	if _, ok := dbDeadline(t, db, l.ID()); ok {
		t.Error("session row left after Close")
	}
	var claims, canceled int
	if err := db.QueryRow(`SELECT (SELECT count(*) FROM work WHERE machine_id = $1),
		(SELECT count(*) FROM work_history WHERE machine_id = $1 AND event = 'Canceled')`, m).Scan(&claims, &canceled); err != nil {
		t.Fatal(err)
	}
	if claims != 0 || canceled != 1 {
		t.Errorf("%d claims left, %d Canceled rows; want 0 and 1", claims, canceled)
	}
}

// TakeOver leaves a live session alone and supersedes an expired one: its
// claims end as Abandoned and its row goes.
func TestTakeOverSupersedesOnlyExpiredSessions(t *testing.T) {
	t.Parallel()
	r, db := newRunner(t)
	holder := start(t, r, time.Minute, nil)
	m := uuid.New()
	if _, err := db.Exec("INSERT INTO machines (machine_id) VALUES ($1)", m); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO work (machine_id, process, session_id) VALUES ($1, 'install', $2)", m, holder.ID()); err != nil {
		t.Fatal(err)
	}
	takeOver := func() []string {
		var ended []string
		err := r.Run(context.Background(), txn.Serializable, nil, func(tx *txn.Tx) error {
			var err error
			ended, err = TakeOver(context.Background(), tx, holder.ID())
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return ended
	}
	if ended := takeOver(); len(ended) != 0 {
		t.Fatalf("live session taken over: %v", ended)
	}
	if _, ok := dbDeadline(t, db, holder.ID()); !ok {
		t.Fatal("live session's row deleted")
	}
	if _, err := db.Exec("UPDATE sessions SET deadline = now() - interval '1 second' WHERE session_id = $1", holder.ID()); err != nil {
		t.Fatal(err)
	}
	if ended := takeOver(); !slices.Equal(ended, []string{"install"}) {
		t.Fatalf("expired session: TakeOver ended %v, want [install]", ended)
	}
	if _, ok := dbDeadline(t, db, holder.ID()); ok {
		t.Error("expired session's row left")
	}
	var abandoned int
	if err := db.QueryRow("SELECT count(*) FROM work_history WHERE machine_id = $1 AND event = 'Abandoned'", m).Scan(&abandoned); err != nil {
		t.Fatal(err)
	}
	if abandoned != 1 {
		t.Errorf("%d Abandoned rows, want 1", abandoned)
	}
}

// A GC pass deletes every session expired more than the grace period ago,
// in batches of gcBatch, and nothing else: not a live session, not one
// expired within the grace period.
func TestCollectorPassDeletesOnlyPastGrace(t *testing.T) {
	t.Parallel()
	r, db := newRunner(t)
	live := start(t, r, time.Minute, nil)
	const dead = 2*gcBatch + 17
	if _, err := db.Exec(`INSERT INTO sessions (component_name, runtime_info, interval_seconds, deadline)
		SELECT 'dead', '', 1, now() - interval '1 hour' FROM generate_series(1, $1)`, dead); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO sessions (component_name, runtime_info, interval_seconds, deadline)
		VALUES ('in-grace', '', 1, now() - interval '1 second')`); err != nil {
		t.Fatal(err)
	}
	c := &Collector{Runner: r, Grace: time.Minute}
	deleted, listed, err := c.Pass(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if deleted != dead || listed != dead {
		t.Errorf("Pass deleted %d and listed %d, want %d", deleted, listed, dead)
	}
	var left []string
	rows, err := db.Query("SELECT component_name FROM sessions ORDER BY component_name")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		left = append(left, name)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(left, []string{"in-grace", "lease-test"}) {
		t.Errorf("sessions left: %v, want the one in its grace period and the live one", left)
	}
	if live.Alive() != nil {
		t.Errorf("live session: %v", live.Alive())
	}
	if deleted, _, err := c.Pass(context.Background()); err != nil || deleted != 0 {
		t.Errorf("second pass: %d deleted, %v", deleted, err)
	}
}
