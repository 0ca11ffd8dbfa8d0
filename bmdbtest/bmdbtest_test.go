package bmdbtest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/bmdbtest"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
	"github.com/bmdb-dev/bmdb/migrations"
	"github.com/bmdb-dev/bmdb/worker"
)

// app is an application with one tag table, as a user's would be.
var app = &migrations.Application{Name: "racks", Migrations: fstest.MapFS{
	"000001_done.up.sql":   {Data: []byte("CREATE TABLE done (machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE);")},
	"000001_done.down.sql": {Data: []byte("DROP TABLE done;")},
}}

func TestMain(m *testing.M) { os.Exit(bmdbtest.Run(m, app)) }

const process = "burn-in"

// Each New is a database of its own, with bmdb's schema and Run's
// application's: what one test writes, another does not see.
func TestNewIsFreshAndMigrated(t *testing.T) {
	t.Parallel()
	a := bmdbtest.Open(t, bmdb.Config{})
	b := bmdbtest.Open(t, bmdb.Config{})
	ctx := context.Background()
	for _, conn := range []*bmdb.Connection{a, b} {
		var version int
		if err := conn.DB().QueryRowContext(ctx, "SELECT version FROM racks_schema_migrations").Scan(&version); err != nil || version != 1 {
			t.Fatalf("the application's version: %d, %v", version, err)
		}
	}
	if _, err := a.DB().ExecContext(ctx, "WITH m AS (INSERT INTO machines DEFAULT VALUES RETURNING machine_id) INSERT INTO done SELECT machine_id FROM m"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.DB().QueryRowContext(ctx, "SELECT (SELECT count(*) FROM machines) + (SELECT count(*) FROM done)").Scan(&n); err != nil || n != 0 {
		t.Errorf("the other database has %d rows (%v): not a database of its own", n, err)
	}
}

// Open's Connections run in the tests' mode: through the CockroachDB
// emulator when BMDB_TEST_COCKROACH is set.
func TestOpenInTheTestsMode(t *testing.T) {
	t.Parallel()
	conn := bmdbtest.Open(t, bmdb.Config{})
	var version string
	if err := conn.DB().QueryRow("SELECT version()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if cockroach := strings.Contains(version, "CockroachDB"); cockroach != (testdb.CockroachMode() || testdb.Cockroach()) {
		t.Errorf("server says %q; cockroach mode %v", version, testdb.CockroachMode())
	}
}

// A fleet in each state the Require functions check: machines finished
// once, one in backoff, one whose claim was abandoned (its session
// expired) and then taken over and finished. RunUntilIdle returns the
// loop's *worker.LeftError for the one in backoff.
func TestRunUntilIdleAndRequire(t *testing.T) {
	t.Parallel()
	conn := bmdbtest.Open(t, bmdb.Config{SessionInterval: 2 * time.Second})
	db := conn.DB()
	ctx := context.Background()
	sess, err := conn.StartSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(ctx)
	var ids []uuid.UUID
	if err := sess.Transact(ctx, func(tx *bmdb.Tx) error {
		ids, err = tx.CreateMachines(ctx, 6)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	failing, abandoned := ids[0], ids[1]
	// A session claims one machine and dies: its deadline passes.
	if _, err := sess.Work(ctx, process, func(*bmdb.Tx) ([]uuid.UUID, error) { return []uuid.UUID{abandoned}, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "UPDATE sessions SET deadline = now() - INTERVAL '1 second' WHERE session_id = $1", sess.ID()); err != nil {
		t.Fatal(err)
	}

	loop, err := worker.New(conn, worker.Config{
		Process: process, Retrieve: notDone, Concurrency: 2,
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			if w.Machine() == failing {
				return nil, errors.New("memory test failed")
			}
			return func(tx *bmdb.Tx) error {
				_, err := tx.DBTX().ExecContext(ctx, "INSERT INTO done VALUES ($1)", w.Machine())
				return err
			}, nil
		},
		Backoff:      bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour, Exponent: 2},
		PollMin:      10 * time.Millisecond,
		PollMax:      50 * time.Millisecond,
		StopWhenIdle: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	err = bmdbtest.RunUntilIdle(t, time.Minute, loop)
	var left *worker.LeftError
	if !errors.As(err, &left) || left.InBackoff != 1 || left.ClaimedByOthers != 0 {
		t.Errorf("RunUntilIdle = %v, want the loop's *worker.LeftError with one machine in backoff", err)
	}
	bmdbtest.RequireFinishedOnce(t, db, process, ids[1:]...)
	bmdbtest.RequireInBackoff(t, db, process, failing)
	bmdbtest.RequireAbandoned(t, db, process, abandoned)

	// And what they say when a machine fails the check.
	for _, tc := range []struct {
		name    string
		require func(testing.TB)
		want    string
	}{
		{"finished once", func(t testing.TB) { bmdbtest.RequireFinishedOnce(t, db, process, ids[2], failing) },
			fmt.Sprintf(`1 of 2 machines are not finished exactly once and not claimed for process "burn-in": %s (Started 1, Failed 1, in backoff now)`, failing)},
		{"in backoff", func(t testing.TB) { bmdbtest.RequireInBackoff(t, db, process, ids[2]) },
			fmt.Sprintf(`1 of 1 machines are not in backoff and not claimed for process "burn-in": %s (Started 1, Finished 1)`, ids[2])},
		{"abandoned", func(t testing.TB) { bmdbtest.RequireAbandoned(t, db, "other", ids...) },
			fmt.Sprintf(`6 of 6 machines are not abandoned at least once for process "other": %s (no history);`, ids[0])},
		{"no machines", func(t testing.TB) { bmdbtest.RequireAbandoned(t, db, process) }, "bmdbtest: no machines given"},
	} {
		r := record(tc.require)
		if len(r.errors) != 1 || !strings.Contains(r.errors[0], tc.want) {
			t.Errorf("%s: reported %q, want one error with %q", tc.name, r.errors, tc.want)
		}
	}
}

// RunUntilIdle fails the test, and stops the loops, when they do not stop
// by themselves.
func TestRunUntilIdleTimesOut(t *testing.T) {
	t.Parallel()
	stopped := make(chan struct{})
	r := record(func(t testing.TB) {
		bmdbtest.RunUntilIdle(t, 50*time.Millisecond, runner(func(ctx context.Context) error {
			<-ctx.Done()
			close(stopped)
			return nil
		}))
	})
	if !r.fatal || len(r.errors) != 1 || !strings.Contains(r.errors[0], "still running after 50ms (is worker.Config.StopWhenIdle set?)") {
		t.Errorf("reported %q (fatal %v)", r.errors, r.fatal)
	}
	select {
	case <-stopped:
	default:
		t.Error("RunUntilIdle returned before the loop did")
	}
}

type runner func(ctx context.Context) error

func (f runner) Run(ctx context.Context) error { return f(ctx) }

// notDone proposes the machines without a done row or a live claim.
func notDone(ctx context.Context, tx *bmdb.Tx, limit int32) ([]uuid.UUID, error) {
	var ids []uuid.UUID
	err := tx.DBTX().QueryRowContext(ctx, `SELECT COALESCE(array_agg(machine_id), '{}') FROM (
		SELECT m.machine_id FROM machines m
		WHERE NOT EXISTS (SELECT 1 FROM done d WHERE d.machine_id = m.machine_id)
		  AND NOT EXISTS (SELECT 1 FROM work w JOIN sessions s USING (session_id)
		                  WHERE w.machine_id = m.machine_id AND s.deadline > now())
		LIMIT $1) c`, limit).Scan(pq.Array(&ids))
	return ids, err
}

// recorder is a testing.TB that records what a helper reports.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	errors []string
	fatal  bool
}

// record runs f with a recorder, on a goroutine of its own (Fatal ends
// it), and returns what f reported.
func record(f func(testing.TB)) *recorder {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	r.mu.Lock()
	r.fatal = true
	r.mu.Unlock()
	runtime.Goexit()
}

func (r *recorder) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }
