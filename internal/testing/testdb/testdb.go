// Package testdb gives each test a fresh database on the test server. On
// PostgreSQL new databases are cloned from a template migrated once per
// test binary; on CockroachDB each is created and migrated.
//
// The server is the one BMDB_TEST_DSN names (make test sets it to a
// throwaway PostgreSQL that scripts/with-pg starts for all packages).
// Without BMDB_TEST_DSN, the first test that needs a database starts a
// PostgreSQL for the whole test binary (server.go): initdb and pg_ctl
// from the first directory on PATH holding both, or else from the newest
// /usr/lib/postgresql/*/bin (Debian's packages); a cluster in a new
// directory in $TMPDIR, on 127.0.0.1 on a free port, with
// scripts/pg-start's settings (fsync off, 400 connections), run as the
// user postgres when the tests run as root (created if missing). It
// takes one to two seconds. A watchdog process started with it stops it
// and removes its directory once the test binary is gone: at the end of
// Run, which waits for that, or when the binary dies without running its
// clean-up (a panic, go test -timeout, SIGKILL), within a second. With
// no server installed, the tests that need one fail with ErrNoServer,
// which says what to install.
package testdb

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lib/pq"
	"go.uber.org/goleak"

	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
)

// EnvDSN names the environment variable holding the DSN of the server tests
// create their databases on. The DSN's user must be allowed to create
// databases.
const EnvDSN = "BMDB_TEST_DSN"

var (
	mode      crdbmode.Settings // the binary's cockroach mode (EnvVar)
	counts    crdbmode.Counts   // what its emulators injected
	setup     func(ctx context.Context, dsn string) error
	admin     *sql.DB
	serverDSN string
	cockroach bool
	template  string
	initOnce  sync.Once
	initErr   error
	counter   atomic.Int64
)

// Run runs the tests of a package and returns the exit code, as m.Run
// does: TestMain calls os.Exit(testdb.Run(m, migrate)), or runs its own
// clean-up between the two (os.Exit skips deferred calls).
// migrate brings a new database to the schema tests expect; New calls it
// once for the template. After the tests Run drops the template, stops
// the binary's own server if a test started one (removing its
// directory), and fails the run if goroutines leaked. With -test.v it
// says how long its own server took to start.
//
// If crdbmode.EnvVar is set, the package's tests run in cockroach mode
// (Emulator; see package crdbmode), and the counts of injected errors are
// printed after them. A malformed crdbmode.EnvVar is exit code 2.
func Run(m *testing.M, migrate func(ctx context.Context, dsn string) error) int {
	setup = migrate
	var err error
	if mode, err = crdbmode.FromEnv(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	code := m.Run()
	if mode.Enabled {
		fmt.Fprintln(os.Stderr, "testdb:", counts.Report())
	}
	cleanUp()
	if own != nil {
		if testing.Verbose() {
			fmt.Fprintf(os.Stderr, "testdb: %s was not set: the tests ran on a PostgreSQL of their own, started in %v\n",
				EnvDSN, own.took.Round(time.Millisecond))
		}
		if err := own.stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = cmp.Or(code, 1)
		}
	}
	if code == 0 {
		// golang-migrate prefetches the next migration into a pipe; when a
		// migration fails half-way (the half-applied migration tests) and
		// a later one exists, that goroutine stays blocked on the pipe
		// (golang-migrate has no way to stop it). One per failed run.
		if err := goleak.Find(goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
			goleak.IgnoreAnyFunction("github.com/golang-migrate/migrate/v4.(*Migration).Buffer")); err != nil {
			fmt.Fprintf(os.Stderr, "testdb: goroutines leaked: %v\n", err)
			code = 1
		}
	}
	return code
}

// Cockroach reports whether the test server is a CockroachDB cluster (not
// cockroach mode on PostgreSQL), once New, NewEmpty or NewForExample has
// connected.
func Cockroach() bool { return cockroach }

// SkipOnCockroach skips t on a CockroachDB cluster, saying why.
func SkipOnCockroach(t testing.TB, why string) {
	t.Helper()
	connect(t)
	if cockroach {
		t.Skip("not on CockroachDB: " + why)
	}
}

// CockroachMode reports whether the tests run in cockroach mode on
// PostgreSQL (package crdbmode).
func CockroachMode() bool { return mode.Enabled }

// Emulator returns a new cockroach-mode emulator for one Connection (its
// Wrap is the Connection's Config.WrapConnector), or nil if the tests do
// not run in cockroach mode.
func Emulator() *crdbmode.Emulator {
	if !mode.Enabled {
		return nil
	}
	return crdbmode.New(mode, &counts)
}

// WrapConnector is a Connection's bmdb.Config.WrapConnector in the tests'
// mode: a new Emulator's Wrap in cockroach mode, nil otherwise.
func WrapConnector() func(driver.Connector) driver.Connector {
	if em := Emulator(); em != nil {
		return em.Wrap
	}
	return nil
}

// EmulatorWith returns a new emulator with settings s, for a test that
// runs in cockroach mode whatever the binary does.
func EmulatorWith(s crdbmode.Settings) *crdbmode.Emulator { return crdbmode.New(s, &counts) }

// DSN returns the DSN of the server tests create their databases on:
// BMDB_TEST_DSN's, or else the test binary's own, which it starts on the
// first call (see the package doc). It fails t if that server cannot be
// started (ErrNoServer if none is installed).
func DSN(t testing.TB) string {
	t.Helper()
	dsn, err := findDSN()
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// New returns the DSN of a new database with the current schema, dropped
// when t ends.
func New(t testing.TB) string {
	t.Helper()
	connect(t)
	dsn, drop, err := create(true)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(drop)
	return dsn
}

// NewForExample is New for examples, which have no testing.TB: it returns
// the DSN of a new database with the current schema and a function that
// drops it, or panics.
func NewForExample() (dsn string, drop func()) {
	server, err := findDSN()
	if err != nil {
		panic(err)
	}
	if err := connectDSN(server); err != nil {
		panic(err)
	}
	dsn, drop, err = create(true)
	if err != nil {
		panic(err)
	}
	return dsn, drop
}

// NewEmpty returns the DSN of a new database without any schema, dropped
// when t ends.
func NewEmpty(t testing.TB) string {
	t.Helper()
	connect(t)
	dsn, drop, err := create(false)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(drop)
	return dsn
}

// WithDatabase returns dsn (URL or key=value form) pointing at database name.
func WithDatabase(dsn, name string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err == nil {
			u.Path = "/" + name
			return u.String()
		}
	}
	return dsn + " dbname=" + name
}

// create makes a new database, with the schema if migrated, and returns its
// DSN and a function that drops it.
func create(migrated bool) (string, func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := fmt.Sprintf("bmdb_t%d_%d", os.Getpid(), counter.Add(1))
	var err error
	if migrated && !cockroach {
		_, err = admin.ExecContext(ctx, "CREATE DATABASE "+pq.QuoteIdentifier(name)+" TEMPLATE "+pq.QuoteIdentifier(template))
	} else {
		_, err = admin.ExecContext(ctx, "CREATE DATABASE "+pq.QuoteIdentifier(name))
	}
	if err != nil {
		return "", nil, fmt.Errorf("creating database %s: %w", name, err)
	}
	dsn := WithDatabase(serverDSN, name)
	if migrated && cockroach {
		if err := setup(ctx, dsn); err != nil {
			drop(name)
			return "", nil, fmt.Errorf("migrating %s: %w", name, err)
		}
	}
	return dsn, func() { drop(name) }, nil
}

func drop(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var err error
	if cockroach {
		_, err = admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+pq.QuoteIdentifier(name)+" CASCADE")
	} else {
		_, err = admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+pq.QuoteIdentifier(name)+" WITH (FORCE)")
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "testdb: dropping database %s: %v\n", name, err)
	}
}

// connect connects to the server once per test binary, or fails t.
func connect(t testing.TB) {
	t.Helper()
	if setup == nil {
		t.Fatal("testdb: call testdb.Run from TestMain first")
	}
	if err := connectDSN(DSN(t)); err != nil {
		t.Fatalf("testdb: %v", err)
	}
}

// connectDSN connects to the server at dsn once per test binary.
func connectDSN(dsn string) error {
	initOnce.Do(func() { initErr = initServer(dsn) })
	return initErr
}

// initServer connects to the server and, on PostgreSQL, builds the template.
func initServer(dsn string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return err
	}
	var version string
	if err := db.QueryRowContext(ctx, "SELECT version()").Scan(&version); err != nil {
		db.Close()
		return fmt.Errorf("connecting to the tests' server: %w", err)
	}
	admin = db
	serverDSN = dsn
	cockroach = strings.Contains(version, "CockroachDB")
	if cockroach {
		return nil
	}
	name := fmt.Sprintf("bmdb_tmpl%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+pq.QuoteIdentifier(name)); err != nil {
		return err
	}
	template = name
	if err := setup(ctx, WithDatabase(dsn, name)); err != nil {
		return fmt.Errorf("migrating template: %w", err)
	}
	return nil
}

func cleanUp() {
	if admin == nil {
		return
	}
	if template != "" {
		drop(template)
	}
	admin.Close()
}

// Eventually polls cond every 10ms until it holds, failing t after timeout
// with what it waited for.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// WithApplicationName returns dsn (URL form) with application_name set, so
// that KillConnections and Connections can find its connections.
func WithApplicationName(t testing.TB, dsn, app string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("testdb: DSN is not a URL: %v", err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	return u.String()
}

// Statements of KillConnections and Connections, per engine.
const (
	pgKillSQL = `SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name = $1`
	pgCountSQL    = `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`
	crdbCountSQL  = `SELECT count(*) FROM [SHOW CLUSTER SESSIONS] WHERE application_name = $1`
	crdbCancelSQL = `CANCEL SESSIONS (SELECT session_id FROM [SHOW CLUSTER SESSIONS] WHERE application_name = $1)`
)

// KillConnections ends the server side of every connection to the test
// database whose application_name is app, as a restart would: with
// pg_terminate_backend on PostgreSQL, which waits (up to 5 s) for each
// backend to exit, so that the next statement on a killed connection
// fails; CANCEL SESSIONS on CockroachDB. It returns how many it ended.
func KillConnections(ctx context.Context, db *sql.DB, app string) (int64, error) {
	if !cockroach {
		var n int64
		err := db.QueryRowContext(ctx, pgKillSQL, app).Scan(&n)
		return n, err
	}
	var n int64
	if err := db.QueryRowContext(ctx, crdbCountSQL, app).Scan(&n); err != nil || n == 0 {
		return 0, err
	}
	_, err := db.ExecContext(ctx, crdbCancelSQL, app)
	return n, err
}

// Connections counts the server's connections whose application_name is
// app.
func Connections(ctx context.Context, db *sql.DB, app string) (int, error) {
	var n int
	if cockroach {
		err := db.QueryRowContext(ctx, crdbCountSQL, app).Scan(&n)
		return n, err
	}
	err := db.QueryRowContext(ctx, pgCountSQL, app).Scan(&n)
	return n, err
}
