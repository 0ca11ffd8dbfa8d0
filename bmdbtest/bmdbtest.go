// Package bmdbtest is test tooling for applications built on bmdb, as
// River's rivertest is for River's: a fresh database per test with bmdb's
// schema and the application's, connections in the tests' mode, a runner
// that takes worker loops until they are idle, and assertions on claims
// and history. Tests run against a real server, never a mock:
//
//	func TestMain(m *testing.M) { os.Exit(bmdbtest.Run(m, firmware.Application())) }
//
//	func TestUpdate(t *testing.T) {
//		dsn := bmdbtest.New(t)
//		conn := bmdbtest.Open(t, bmdb.Config{DSN: dsn, ComponentName: "updater"})
//		ids := seed(t, conn, 20)
//		loop, err := worker.New(conn, firmware.LoopConfig(worker.Config{StopWhenIdle: 200 * time.Millisecond}))
//		if err != nil {
//			t.Fatal(err)
//		}
//		if err := bmdbtest.RunUntilIdle(t, time.Minute, loop); err != nil {
//			t.Fatal(err) // a *worker.LeftError says what was left undone
//		}
//		bmdbtest.RequireFinishedOnce(t, conn.DB(), "firmware-update", ids...)
//	}
//
// # The server
//
// Each test gets a database of its own on one server per test binary. On
// PostgreSQL every database is cloned from a template that Run's first
// New migrates, which takes milliseconds; on CockroachDB, which has no
// templates, each is created and migrated. Each is dropped when its test
// ends, and the template when Run returns.
//
// With nothing set, go test needs no setup: the first test that needs a
// database starts a throwaway PostgreSQL for the test binary, from the
// server binaries installed on the machine (initdb and pg_ctl on PATH, or
// Debian's /usr/lib/postgresql/*/bin, newest version first). It listens
// on 127.0.0.1 on a free port, trades durability for speed (fsync off),
// runs as the user postgres when the tests run as root (PostgreSQL
// refuses to run as root), and takes a second or two to start (go test
// -v prints how long). Run stops it and removes its directory; so does a
// watchdog process started with it if the binary dies first (a panic, go
// test -timeout, kill -9), so that no run leaves a server or a directory
// behind. Without a server installed, the tests that need one fail,
// saying to install it (apt-get install postgresql, on Debian) or to set
// BMDB_TEST_DSN.
//
// The environment variable BMDB_TEST_DSN, when set, names the server to
// use instead (PostgreSQL or CockroachDB), shared by every test binary
// of a go test run: set it to test against CockroachDB, or to save the
// start per package. Its user must be allowed to create databases.
// bmdb's scripts/pg-start DIR starts a throwaway PostgreSQL and prints
// its DSN.
//
// # Cockroach mode
//
// With BMDB_TEST_COCKROACH set (for instance to "retry=0.02": bmdb's
// Makefile documents the settings), the Connections that Open returns run
// through an emulator of CockroachDB in front of PostgreSQL: bmdb takes
// its CockroachDB code paths (savepoint restarts, its migration driver,
// its clock margin) and meets CockroachDB's errors (serialization
// failures at statements and at commit, lost connections at the commit
// point) at the given rates, so that an application's tests show that its
// retrievals and commits survive retries. It does not reproduce
// CockroachDB's clocks or schema changer: run the tests against a real
// cluster (BMDB_TEST_DSN) too before a first production deploy.
package bmdbtest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
	"github.com/bmdb-dev/bmdb/migrations"
)

// EnvDSN is the environment variable naming the server tests create their
// databases on, e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable.
const EnvDSN = testdb.EnvDSN

// app is the application Run was given: its schema is in every database
// New returns, and Open opens with it. Set by Run before any test runs.
var app *migrations.Application

// Run runs a package's tests and returns the exit code, as m.Run does:
// call it from TestMain, as os.Exit(bmdbtest.Run(m, app)), or run
// TestMain's own clean-up between Run and os.Exit (os.Exit skips
// deferred calls). app is the application's schema, applied after bmdb's
// to every database New returns and used by Open; nil for bmdb's schema
// alone.
//
// After the tests Run drops the template database and fails the run
// (exit code 1) if goroutines leaked: a Connection, Session or Loop
// left running. A malformed BMDB_TEST_COCKROACH is exit code 2. Without
// BMDB_TEST_DSN, Run also stops the server the tests started (see "The
// server").
func Run(m *testing.M, application *migrations.Application) int {
	app = application
	return testdb.Run(m, func(ctx context.Context, dsn string) error {
		c, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: "bmdbtest", Application: app})
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// New returns the DSN of a new database with bmdb's schema and Run's
// application's, current, dropped when t ends (after t's other clean-ups,
// which close what t opened on it). The first New of a binary without
// BMDB_TEST_DSN starts the binary's server (see "The server"). It fails t
// if there is no server, or it cannot create the database.
func New(t testing.TB) string {
	t.Helper()
	return testdb.New(t)
}

// Open opens a Connection with cfg, closed when t ends, and fails t if
// Open fails. An empty cfg.DSN is a new database (New); an empty
// cfg.ComponentName is "bmdbtest"; a nil cfg.Application is Run's
// application; a nil cfg.WrapConnector is the cockroach-mode emulator
// when BMDB_TEST_COCKROACH is set. The Connection's Sessions and Loops
// must end before t does (Session.Close, Run's context).
func Open(t testing.TB, cfg bmdb.Config) *bmdb.Connection {
	t.Helper()
	if cfg.DSN == "" {
		cfg.DSN = New(t)
	}
	cfg.ComponentName = cmp.Or(cfg.ComponentName, "bmdbtest")
	if cfg.Application == nil {
		cfg.Application = app
	}
	if cfg.WrapConnector == nil {
		cfg.WrapConnector = testdb.WrapConnector()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := bmdb.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("bmdbtest: Open: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// Runner is what RunUntilIdle runs: a *worker.Loop.
type Runner interface {
	Run(ctx context.Context) error
}

// RunUntilIdle runs loops at once, each with Run, until every Run has
// returned, and returns their errors joined (nil if all returned nil).
// The loops must stop by themselves: configure them with
// worker.Config.StopWhenIdle, and DrainTimeout to wait for backoffs and
// other sessions' claims; a loop that stopped with work left returns a
// *worker.LeftError that says how much.
//
// If they have not all returned within timeout, RunUntilIdle cancels
// their context, waits for them to shut down, and fails t, saying so.
// It must be called from the test's goroutine.
func RunUntilIdle(t testing.TB, timeout time.Duration, loops ...Runner) error {
	t.Helper()
	if len(loops) == 0 {
		t.Fatal("bmdbtest: RunUntilIdle: no loops given")
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	errs := make(chan error, len(loops))
	for _, l := range loops {
		go func() { errs <- l.Run(ctx) }()
	}
	var all []error
	for range loops {
		all = append(all, <-errs)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("bmdbtest: RunUntilIdle: the loops were still running after %v (is worker.Config.StopWhenIdle set?)", timeout)
	}
	if err := errors.Join(all...); err != nil {
		return fmt.Errorf("bmdbtest: RunUntilIdle: %w", err)
	}
	return nil
}
