package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
	"github.com/bmdb-dev/bmdb/model"
)

func TestMain(m *testing.M) {
	switch mode := os.Getenv(childModeEnv); mode {
	case "":
	default:
		os.Exit(runChild(mode))
	}
	os.Exit(testdb.Run(m, func(ctx context.Context, dsn string) error {
		c, err := Open(ctx, Config{DSN: dsn, ComponentName: "testdb"})
		if err != nil {
			return err
		}
		return c.Close()
	}))
}

// testInterval is the session interval of tests: short, so expiry is fast.
const testInterval = time.Second

// env is one test's database: its DSN and a raw pool for assertions.
type env struct {
	t   *testing.T
	dsn string
	db  *sql.DB
	q   *model.Queries
}

func newEnv(t *testing.T) *env {
	t.Helper()
	t.Parallel()
	return serialEnv(t)
}

// serialEnv is newEnv for a test that does not run in parallel with
// others (one that counts goroutines, say).
func serialEnv(t *testing.T) *env {
	t.Helper()
	dsn := testdb.New(t)
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &env{t: t, dsn: dsn, db: db, q: model.New(db)}
}

// config returns a test Config for the env's database. Its clock margin
// is small (cockroach mode's sessions count themselves dead that much
// before the interval): with the default, a session of testInterval would
// live 500 ms after each heartbeat, too short for a loaded 2-core machine.
func (e *env) config() Config {
	return Config{DSN: e.dsn, ComponentName: "test", RuntimeInfo: e.t.Name(), SessionInterval: testInterval,
		MaxClockOffset: 100 * time.Millisecond}
}

// open opens a Connection closed at cleanup, in cockroach mode if the
// tests run in it (testdb.Emulator); mods adjust its Config (withMode
// chooses the mode).
func (e *env) open(mods ...func(*Config)) *Connection {
	e.t.Helper()
	cfg := e.config()
	em := testdb.Emulator()
	if em != nil {
		cfg.WrapConnector = em.Wrap
	}
	for _, mod := range mods {
		mod(&cfg)
	}
	if forced, ok := forcedEmulators.LoadAndDelete(&cfg); ok {
		em = forced.(*crdbmode.Emulator)
	} else if cfg.WrapConnector == nil {
		em = nil
	}
	c, err := Open(context.Background(), cfg)
	if err != nil {
		e.t.Fatalf("Open: %v", err)
	}
	if em != nil {
		emulators.Store(c, em)
	}
	e.t.Cleanup(func() {
		c.Close()
		emulators.Delete(c)
	})
	return c
}

// The cockroach-mode emulators of the tests' Connections (env.open), and
// those that withMode put in Configs that env.open has not opened yet.
var emulators, forcedEmulators sync.Map

// withMode returns a Config modifier that opens the Connection in
// cockroach mode with s (testdb.EmulatorWith), or, if s is not enabled,
// on the server as it is, whatever mode the tests run in.
func withMode(s crdbmode.Settings) func(*Config) {
	return func(c *Config) {
		if !s.Enabled {
			c.WrapConnector = nil
			return
		}
		em := testdb.EmulatorWith(s)
		c.WrapConnector = em.Wrap
		forcedEmulators.Store(c, em)
	}
}

// emulatorOf returns c's cockroach-mode emulator, nil if it has none.
func emulatorOf(c *Connection) *crdbmode.Emulator {
	if em, ok := emulators.Load(c); ok {
		return em.(*crdbmode.Emulator)
	}
	return nil
}

// exact turns off cockroach mode's injected errors on c, for tests that
// count retries.
func exact(c *Connection) {
	if em := emulatorOf(c); em != nil {
		em.Off()
	}
}

// session starts a Session on c, closed at cleanup.
func (e *env) session(c *Connection) *Session {
	e.t.Helper()
	s, err := c.StartSession(context.Background())
	if err != nil {
		e.t.Fatalf("StartSession: %v", err)
	}
	e.t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

// machine inserts a machine.
func (e *env) machine() uuid.UUID {
	e.t.Helper()
	var id uuid.UUID
	if err := e.db.QueryRow("INSERT INTO machines DEFAULT VALUES RETURNING machine_id").Scan(&id); err != nil {
		e.t.Fatal(err)
	}
	return id
}

// fence creates the claim rows of (machine, process) for ids, as the
// fencer does before a pair's first claim, for tests that count a batch's
// transactions: a first claim without one runs its attempt again.
func (e *env) fence(process string, ids ...uuid.UUID) {
	e.t.Helper()
	e.exec(`INSERT INTO work_fencing (machine_id, process, token) SELECT unnest($1::UUID[]), $2, 0
		ON CONFLICT DO NOTHING`, pq.Array(ids), process)
}

// exec runs a statement on the raw pool.
func (e *env) exec(query string, args ...any) {
	e.t.Helper()
	if _, err := e.db.Exec(query, args...); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
}

// expireInDB moves a session's deadline into the past on the database, as
// if its heartbeats had stopped `ago` ago.
func (e *env) expireInDB(id uuid.UUID, ago time.Duration) {
	e.t.Helper()
	e.exec("UPDATE sessions SET deadline = now() - $2 * INTERVAL '1 second' WHERE session_id = $1", id, ago.Seconds())
}

// events returns a machine's history as "event@session-index" strings,
// numbering sessions in the order given.
func (e *env) events(machine uuid.UUID, sessions ...*Session) []string {
	e.t.Helper()
	rows, err := e.q.WorkHistoryForMachine(context.Background(), machine)
	if err != nil {
		e.t.Fatal(err)
	}
	out := []string{}
	for _, r := range rows {
		who := "?"
		for i, s := range sessions {
			if s.ID() == r.SessionID {
				who = string(rune('1' + i))
			}
		}
		out = append(out, r.Process+":"+string(r.Event)+"@"+who)
	}
	return out
}

// alive reports whether the database considers the session alive.
func (e *env) aliveInDB(id uuid.UUID) bool {
	e.t.Helper()
	var alive bool
	err := e.db.QueryRow("SELECT deadline > now() FROM sessions WHERE session_id = $1", id).Scan(&alive)
	if errors.Is(err, sql.ErrNoRows) {
		return false
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return alive
}

// count runs a COUNT query.
func (e *env) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.db.QueryRow(query, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// eventually is testdb.Eventually.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testdb.Eventually(t, timeout, what, cond)
}

// waitDone waits for the session to end, failing after timeout.
func waitDone(t *testing.T, s *Session, timeout time.Duration) {
	t.Helper()
	select {
	case <-s.Done():
	case <-time.After(timeout):
		t.Fatalf("session did not end within %v", timeout)
	}
}

// retrieveAll returns a retrieval that proposes the given machines.
func retrieveAll(ids ...uuid.UUID) func(*Tx) ([]uuid.UUID, error) {
	return func(*Tx) ([]uuid.UUID, error) { return ids, nil }
}

// retrieveIdle proposes machines without work or backoff for process.
func retrieveIdle(process string) func(*Tx) ([]uuid.UUID, error) {
	return func(tx *Tx) ([]uuid.UUID, error) {
		return tx.Queries().MachinesWithoutWork(context.Background(), model.MachinesWithoutWorkParams{Process: process, RowLimit: 10})
	}
}

func noCommit(*Tx) error { return nil }

// slicesEqual reports whether got holds exactly want, in order.
func slicesEqual(got []string, want ...string) bool { return slices.Equal(got, want) }

// txKey is an expression that tells the transaction that wrote a row:
// PostgreSQL's xmin, CockroachDB's MVCC timestamp (its commit timestamp).
func txKey() string {
	if testdb.Cockroach() {
		return "crdb_internal_mvcc_timestamp"
	}
	return "xmin::text"
}
