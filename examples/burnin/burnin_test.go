package burnin

import (
	"context"
	"database/sql"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/bmdbtest"
	"github.com/bmdb-dev/bmdb/migrations"
	"github.com/bmdb-dev/bmdb/worker"
)

// TestMain runs the tests on databases with bmdb's schema and the
// application's (bmdbtest): each test's own, cloned from a template, on
// the server named by BMDB_TEST_DSN, or else on a throwaway PostgreSQL
// that the test binary starts for itself.
func TestMain(m *testing.M) { os.Exit(bmdbtest.Run(m, Application())) }

// The committed bmdb_schema.sql is bmdb's schema of the version in go.mod:
// regenerate it with go tool bmdb-schema >
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
		t.Error("bmdb_schema.sql is not bmdb's current schema: run go tool bmdb-schema > bmdb_schema.sql, then sqlc generate")
	}
}

// Two burn-in workers compete for 300 racked machines, a fifth of the
// burn-ins failing: each machine is burned in exactly once, the failed ones
// after their backoff, and both loops return nil by themselves once
// nothing is left (StopWhenIdle, waiting for the backoffs and for each
// other's claims with DrainTimeout).
func TestBurnIn(t *testing.T) {
	t.Parallel()
	dsn := bmdbtest.New(t)
	ctx := context.Background()
	const machines = 300
	burn := func(ctx context.Context, machine uuid.UUID, token int64) (time.Duration, error) {
		if rand.N(5) == 0 {
			return 0, errors.New("memory test failed")
		}
		return 90 * time.Minute, nil
	}
	var ids []uuid.UUID
	var loops []bmdbtest.Runner
	var stats []func() worker.Stats
	for i, component := range []string{"burner-a", "burner-b"} {
		conn := bmdbtest.Open(t, bmdb.Config{DSN: dsn, ComponentName: component})
		if i == 0 {
			var err error
			if ids, err = Seed(ctx, conn, machines, "rack-7"); err != nil {
				t.Fatal(err)
			}
		}
		loop, err := worker.New(conn, LoopConfig(burn, worker.Config{
			Concurrency:  4,
			Backoff:      bmdb.Backoff{Initial: 10 * time.Millisecond, Maximum: 50 * time.Millisecond, Exponent: 2},
			PollMin:      10 * time.Millisecond,
			PollMax:      100 * time.Millisecond,
			StopWhenIdle: 100 * time.Millisecond,
			DrainTimeout: 30 * time.Second,
		}))
		if err != nil {
			t.Fatal(err)
		}
		loops, stats = append(loops, loop), append(stats, loop.Stats)
	}
	if err := bmdbtest.RunUntilIdle(t, 2*time.Minute, loops...); err != nil {
		t.Fatal(err)
	}

	db := bmdbtest.Open(t, bmdb.Config{DSN: dsn}).DB()
	bmdbtest.RequireFinishedOnce(t, db, Process, ids...)
	var burned, failed int
	if err := db.QueryRow("SELECT count(*) FROM machine_burned_in WHERE burn_in_minutes = 90").Scan(&burned); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT count(*) FROM work_history WHERE process = $1 AND event = 'Failed'`, Process).Scan(&failed); err != nil {
		t.Fatal(err)
	}
	if burned != machines {
		t.Errorf("%d machines burned in, want %d", burned, machines)
	}
	s0, s1 := stats[0](), stats[1]()
	if s0.Finished == 0 || s1.Finished == 0 {
		t.Errorf("one loop did all the work: %+v, %+v", s0, s1)
	}
	if int64(failed) != s0.Failed+s1.Failed || failed == 0 {
		t.Errorf("%d Failed events, loops counted %d", failed, s0.Failed+s1.Failed)
	}
	t.Logf("burned in %d machines (%d by burner-a, %d by burner-b), %d failures retried",
		burned, s0.Finished, s1.Finished, failed)
}

// A machine whose burn-in keeps failing is left in backoff: the loop
// says so (a *worker.LeftError) instead of returning nil, and the
// command exits with an error.
func TestBurnInReportsMachinesLeft(t *testing.T) {
	t.Parallel()
	conn := bmdbtest.Open(t, bmdb.Config{ComponentName: "burner"})
	ids, err := Seed(context.Background(), conn, 5, "rack-7")
	if err != nil {
		t.Fatal(err)
	}
	broken := ids[2]
	loop, err := worker.New(conn, LoopConfig(func(ctx context.Context, machine uuid.UUID, token int64) (time.Duration, error) {
		if machine == broken {
			return 0, errors.New("memory test failed")
		}
		return time.Hour, nil
	}, worker.Config{
		Backoff:      bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour, Exponent: 2},
		PollMin:      10 * time.Millisecond,
		PollMax:      50 * time.Millisecond,
		StopWhenIdle: 100 * time.Millisecond,
	}))
	if err != nil {
		t.Fatal(err)
	}
	err = bmdbtest.RunUntilIdle(t, time.Minute, loop)
	var left *worker.LeftError
	if !errors.As(err, &left) || left.InBackoff != 1 {
		t.Fatalf("RunUntilIdle = %v, want a *worker.LeftError with the broken machine in backoff", err)
	}
	bmdbtest.RequireInBackoff(t, conn.DB(), Process, broken)
	bmdbtest.RequireFinishedOnce(t, conn.DB(), Process, slices.DeleteFunc(ids, func(id uuid.UUID) bool { return id == broken })...)
}

// Every query of burnindb prepares on the application's schema. sqlc
// checks less than that (see sqlc.yaml): it accepts, for instance, a
// WHERE clause on a column that does not exist. PostgreSQL's PREPARE
// resolves every name of a statement without running it.
func TestQueriesPrepare(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("postgres", bmdbtest.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	queries := sqlcQueries(t, "burnindb")
	if len(queries) < 4 {
		t.Fatalf("found %d queries in burnindb, want every one of queries/", len(queries))
	}
	for name, query := range queries {
		stmt, err := db.Prepare(query)
		if err != nil {
			t.Errorf("query %s does not prepare on the schema: %v", name, err)
			continue
		}
		stmt.Close()
	}
}

// sqlcQueries returns the queries of the sqlc package in dir, by name:
// its string constants that start with sqlc's "-- name: " line.
func sqlcQueries(t *testing.T, dir string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	queries := map[string]string{}
	for _, f := range files {
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			spec, ok := n.(*ast.ValueSpec)
			if !ok || len(spec.Values) != 1 {
				return true
			}
			lit, ok := spec.Values[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			text, err := strconv.Unquote(lit.Value)
			if err == nil && strings.HasPrefix(text, "-- name: ") {
				queries[spec.Names[0].Name] = text
			}
			return true
		})
	}
	return queries
}

// Forgetting the Application in bmdb.Config is an error no retry can fix
// (the application's tables are missing): Run says so and returns.
func TestRunWithoutApplicationSchema(t *testing.T) {
	t.Parallel()
	// A database without the application's schema: bmdbtest's have it,
	// so drop it (and its version table) first.
	dsn := bmdbtest.New(t)
	conn := bmdbtest.Open(t, bmdb.Config{DSN: dsn, ComponentName: "burner"})
	if _, err := conn.DB().Exec("DROP VIEW app_machine_stages, app_stages; DROP TABLE machine_burned_in, machine_racked, burnin_schema_migrations"); err != nil {
		t.Fatal(err)
	}
	conn, err := bmdb.Open(context.Background(), bmdb.Config{DSN: dsn, ComponentName: "burner"}) // no Application
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	loop, err := worker.New(conn, LoopConfig(func(context.Context, uuid.UUID, int64) (time.Duration, error) { return 0, nil }, worker.Config{}))
	if err != nil {
		t.Fatal(err)
	}
	err = bmdbtest.RunUntilIdle(t, time.Minute, loop)
	if !errors.Is(err, worker.ErrPermanent) || !strings.Contains(err.Error(), `"machine_racked" does not exist`) {
		t.Fatalf("Run = %v, want ErrPermanent naming the missing table", err)
	}
}
