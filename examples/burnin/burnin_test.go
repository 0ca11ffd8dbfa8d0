package burnin

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
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/migrations"
	"github.com/bmdb-dev/bmdb/worker"
)

// newDatabase creates an empty database on the server named by
// BMDB_TEST_DSN (make test starts a throwaway PostgreSQL and sets it),
// drops it when the test ends, and returns its DSN.
func newDatabase(t *testing.T) string {
	t.Helper()
	server := os.Getenv("BMDB_TEST_DSN")
	if server == "" {
		t.Skip("BMDB_TEST_DSN is not set: run make test, or set it to a PostgreSQL or CockroachDB server's DSN")
	}
	admin, err := sql.Open("postgres", server)
	if err != nil {
		t.Fatalf("BMDB_TEST_DSN: %v", err)
	}
	name := fmt.Sprintf("burnin_test_%d", rand.Uint64())
	if _, err := admin.Exec("CREATE DATABASE " + pq.QuoteIdentifier(name)); err != nil {
		admin.Close()
		t.Fatalf("creating the test database: %v", err)
	}
	t.Cleanup(func() {
		defer admin.Close()
		// Connections still open to it are the test's own, all closed by
		// now (cleanups run last-registered first).
		if _, err := admin.Exec("DROP DATABASE " + pq.QuoteIdentifier(name)); err != nil {
			t.Logf("dropping %s: %v", name, err)
		}
	})
	if u, err := url.Parse(server); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		return u.String()
	}
	return server + " dbname=" + name
}

// The committed bmdb_schema.sql is bmdb's schema of the version in go.mod:
// regenerate it with go run github.com/bmdb-dev/bmdb/cmd/bmdb-schema >
// bmdb_schema.sql (make generate) after upgrading bmdb.
func TestBMDBSchemaIsCurrent(t *testing.T) {
	want, err := migrations.Schema()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("bmdb_schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Error("bmdb_schema.sql is not bmdb's current schema: run go run github.com/bmdb-dev/bmdb/cmd/bmdb-schema > bmdb_schema.sql, then sqlc generate")
	}
}

// Two burn-in workers compete for 300 racked machines, a fifth of the
// burn-ins failing: each machine is burned in exactly once, the failed ones
// after their backoff, and both loops return by themselves once nothing is
// left (StopWhenIdle).
func TestBurnIn(t *testing.T) {
	dsn := newDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const machines = 300
	var failures sync.Map // machine -> failed once already
	burn := func(ctx context.Context, machine uuid.UUID, token int64) (time.Duration, error) {
		if rand.N(5) == 0 {
			failures.Store(machine, true)
			return 0, errors.New("memory test failed")
		}
		return 90 * time.Minute, nil
	}
	var loops []*worker.Loop
	for i, component := range []string{"burner-a", "burner-b"} {
		conn, err := Open(ctx, dsn, component)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { conn.Close() })
		if i == 0 {
			if _, err := Seed(ctx, conn, machines, "rack-7"); err != nil {
				t.Fatal(err)
			}
		}
		loop, err := NewLoop(conn, burn, worker.Config{
			Concurrency:  4,
			Backoff:      bmdb.Backoff{Initial: 10 * time.Millisecond, Maximum: 50 * time.Millisecond, Exponent: 2},
			PollMin:      10 * time.Millisecond,
			PollMax:      100 * time.Millisecond,
			StopWhenIdle: time.Second, // longer than the longest backoff
		})
		if err != nil {
			t.Fatal(err)
		}
		loops = append(loops, loop)
	}
	errs := make(chan error, len(loops))
	for _, l := range loops {
		go func() { errs <- l.Run(ctx) }()
	}
	for range loops {
		if err := <-errs; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	if ctx.Err() != nil {
		t.Fatal("the loops ran until the test's timeout instead of stopping when idle")
	}

	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var burned, finished, machinesFinished, failed int
	if err := db.QueryRow("SELECT count(*) FROM machine_burned_in WHERE burn_in_minutes = 90").Scan(&burned); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT count(*), count(DISTINCT machine_id) FROM work_history
		WHERE process = $1 AND event = 'Finished'`, Process).Scan(&finished, &machinesFinished); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT count(*) FROM work_history WHERE process = $1 AND event = 'Failed'`, Process).Scan(&failed); err != nil {
		t.Fatal(err)
	}
	if burned != machines || finished != machines || machinesFinished != machines {
		t.Errorf("%d machines burned in, %d Finished events for %d machines; want %d of each", burned, finished, machinesFinished, machines)
	}
	s0, s1 := loops[0].Stats(), loops[1].Stats()
	if s0.Finished == 0 || s1.Finished == 0 {
		t.Errorf("one loop did all the work: %+v, %+v", s0, s1)
	}
	if int64(failed) != s0.Failed+s1.Failed || failed == 0 {
		t.Errorf("%d Failed events, loops counted %d", failed, s0.Failed+s1.Failed)
	}
	t.Logf("burned in %d machines (%d by burner-a, %d by burner-b), %d failures retried",
		burned, s0.Finished, s1.Finished, failed)
}

// Forgetting the Application in bmdb.Config is an error no retry can fix
// (the application's tables are missing): Run says so and returns.
func TestRunWithoutApplicationSchema(t *testing.T) {
	dsn := newDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: "burner"}) // no Application
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	loop, err := NewLoop(conn, func(context.Context, uuid.UUID, int64) (time.Duration, error) { return 0, nil }, worker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	err = loop.Run(ctx)
	if !errors.Is(err, worker.ErrPermanent) || !strings.Contains(err.Error(), `"machine_racked" does not exist`) {
		t.Fatalf("Run = %v, want ErrPermanent naming the missing table", err)
	}
}
