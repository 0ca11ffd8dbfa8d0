package bmdb

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"

	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// The tests of bmdb's CockroachDB paths. Each forces cockroach mode on its
// own Connections (withMode), so they run on every test run,
// whether the suite as a whole runs in cockroach mode or not; on a real
// CockroachDB cluster they run as they are.

// cockroachMode is a Config modifier forcing cockroach mode with no random
// injection (tests inject what they need through emulatorOf).
// sqlRelease is crdb's RELEASE SAVEPOINT, CockroachDB's commit point.
const sqlRelease = "RELEASE SAVEPOINT cockroach_restart"

func cockroachMode(c *Config) { withMode(crdbmode.Settings{Enabled: true, RetryRate: 0})(c) }

// injected returns a database error with code, as the injector's.
func injected(code, msg string) error {
	return &pq.Error{Severity: "ERROR", Code: pqerror.Code(code), Message: msg}
}

// Any number of concurrent Opens of one empty database succeed on
// CockroachDB's path, and leave no lock behind: no lease, and no
// golang-migrate lock (whose cockroachdb driver's gave up at once).
// (Before, all but one failed with "can't acquire lock", even with
// SkipMigrations.)
func TestCockroachConcurrentOpens(t *testing.T) {
	t.Parallel()
	dsn := testdb.NewEmpty(t)
	const n = 8
	errs := make(chan error, 2*n)
	open := func(skip bool) {
		cfg := Config{DSN: dsn, ComponentName: "rollout", SkipMigrations: skip}
		cockroachMode(&cfg)
		c, err := Open(context.Background(), cfg)
		if err == nil {
			c.Close()
		}
		errs <- err
	}
	for range n {
		go open(false)
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Open: %v", err)
		}
	}
	// Now current: Opens with and without migrations, at once, take no lock.
	for i := range 2 * n {
		go open(i%2 == 0)
	}
	for range 2 * n {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Open of a current schema: %v", err)
		}
	}
	db := openRaw(t, dsn)
	var leases int
	var driverLock bool
	if err := db.QueryRow("SELECT (SELECT count(*) FROM bmdb_migration_lock), to_regclass('schema_lock') IS NOT NULL").Scan(&leases, &driverLock); err != nil || leases != 0 || driverLock {
		t.Errorf("%d migration leases left, golang-migrate's schema_lock created %v (%v)", leases, driverLock, err)
	}
}

// On CockroachDB, now() keeps its value across a transaction's savepoint
// restarts: a heartbeat retried after its session expired must still see
// it expired. Here the deadline is moved to just ahead, the poke extends
// it, its RELEASE fails with 40001, and the retry runs after the old
// deadline: it must not extend the session (with now() it would).
func TestCockroachRetriedHeartbeatOfExpiredSessionRefused(t *testing.T) {
	e := newEnv(t)
	c := e.open(cockroachMode, func(c *Config) { c.SessionInterval = 2 * time.Second })
	s := e.session(c)
	var stage atomic.Int32 // 0 idle, 1 armed, 2 poke ran, 3 injected
	emulatorOf(c).Hook(func(query string) error {
		switch {
		case stage.Load() == 1 && strings.Contains(query, "UPDATE sessions") && strings.Contains(query, "SET deadline"):
			stage.Store(2)
		case stage.Load() == 2 && query == sqlRelease:
			stage.Store(3)
			time.Sleep(300 * time.Millisecond) // past the old deadline
			return injected(codeSerializationFailure, "restart transaction (injected at RELEASE after a heartbeat)")
		}
		return nil
	})
	// Just ahead: the armed poke sees the session alive, its retry does not.
	e.exec("UPDATE sessions SET deadline = clock_timestamp() + INTERVAL '200 milliseconds' WHERE session_id = $1", s.ID())
	stage.Store(1)
	waitDone(t, s, 5*time.Second)
	if stage.Load() != 3 {
		t.Fatalf("stage %d: the retry was not forced", stage.Load())
	}
	if !errors.Is(s.Err(), ErrSessionExpired) || !strings.Contains(s.Err().Error(), "database clock") {
		t.Errorf("session ended with %v, want expiry on the database clock", s.Err())
	}
	if e.aliveInDB(s.ID()) {
		t.Errorf("the retried heartbeat extended an expired session")
	}
	if st := c.Stats(); st.TxCommitRetries == 0 {
		t.Errorf("stats %+v: the RELEASE retry was not counted", st)
	}
}

// Retries exhausted at RELEASE (CockroachDB's commit point) carry the last
// error and count as commit retries. (Before, Last was nil.)
func TestCockroachRetriesExhaustedAtRelease(t *testing.T) {
	e := newEnv(t)
	c := e.open(cockroachMode, func(c *Config) { c.MaxTxAttempts = 5 })
	s := e.session(c)
	emulatorOf(c).Hook(func(query string) error {
		if query == sqlRelease {
			return injected(codeSerializationFailure, "restart transaction (injected at RELEASE)")
		}
		return nil
	})
	start := time.Now()
	err := s.Transact(context.Background(), func(tx *Tx) error {
		_, err := tx.CreateMachines(context.Background(), 1)
		return err
	})
	var exhausted *RetriesExhaustedError
	if !errors.As(err, &exhausted) || exhausted.Attempts != 5 || sqlState(exhausted.Last) != codeSerializationFailure ||
		!strings.Contains(exhausted.Last.Error(), "RELEASE") {
		t.Fatalf("Transact = %v, want RetriesExhaustedError after 5 attempts with RELEASE's error", err)
	}
	if st := c.Stats(); st.TxCommitRetries < 4 || st.TxRetries < 4 {
		t.Errorf("stats %+v: RELEASE retries not counted", st)
	}
	if n := e.count("SELECT count(*) FROM machines"); n != 0 {
		t.Errorf("%d machines committed", n)
	}
	t.Logf("%v in %v (jittered waits between restarts)", err, time.Since(start))
}

// A 40003 or a lost connection at the commit point is ErrAmbiguousCommit,
// whether the transaction committed or not; a Work resolves its own
// ambiguous claim.
func TestCockroachAmbiguousCommit(t *testing.T) {
	e := newEnv(t)
	// A long interval: no heartbeat commits while a fate is armed.
	c := e.open(cockroachMode, func(c *Config) { c.SessionInterval = 20 * time.Second })
	s := e.session(c)
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		fate      crdbmode.CommitFate
		committed bool
	}{
		{"40003 after commit", crdbmode.CommitThen40003, true},
		{"40003 before commit", crdbmode.RollbackThen40003, false},
		{"lost after commit", crdbmode.CommitThenLost, true},
		{"lost before commit", crdbmode.RollbackThenLost, false},
	} {
		m := e.machine()
		emulatorOf(c).NextCommit(tc.fate)
		w, err := s.Work(ctx, "install", retrieveAll(m))
		if tc.committed {
			if err != nil {
				t.Errorf("%s: Work = %v, want its claim found", tc.name, err)
				continue
			}
			if err := w.Finish(ctx, noCommit); err != nil {
				t.Errorf("%s: Finish = %v", tc.name, err)
			}
		} else if !errors.Is(err, ErrAmbiguousCommit) {
			t.Errorf("%s: Work = %v, want ErrAmbiguousCommit", tc.name, err)
		}
		if n := e.count("SELECT count(*) FROM work WHERE machine_id = $1", m); n != 0 {
			t.Errorf("%s: claim left behind", tc.name)
		}

		emulatorOf(c).NextCommit(tc.fate)
		err = s.Transact(ctx, func(tx *Tx) error {
			_, err := tx.DBTX().ExecContext(ctx, "UPDATE machines SET machine_created_at = '2000-01-01' WHERE machine_id = $1", m)
			return err
		})
		if !errors.Is(err, ErrAmbiguousCommit) {
			t.Errorf("%s: Transact = %v, want ErrAmbiguousCommit", tc.name, err)
		}
		updated := e.count("SELECT count(*) FROM machines WHERE machine_id = $1 AND machine_created_at = '2000-01-01'", m) == 1
		if updated != tc.committed {
			t.Errorf("%s: committed %v, want %v", tc.name, updated, tc.committed)
		}
	}
}

// The clock margin is Config.MaxClockOffset: a session counts itself dead
// that much before the interval on CockroachDB, and an interval with less
// than half of it left is refused.
func TestCockroachClockMargin(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	cockroachMode(&cfg)
	cfg.SessionInterval, cfg.MaxClockOffset = 900*time.Millisecond, 0 // the default offset
	if _, err := Open(context.Background(), cfg); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "MaxClockOffset") {
		t.Fatalf("Open with a 900ms interval and the default offset = %v, want ErrInvalidArgument naming MaxClockOffset", err)
	}
	c := e.open(cockroachMode, func(c *Config) { c.MaxClockOffset = 300 * time.Millisecond })
	c.leaseHooks.BeforeHeartbeat = func(context.Context) error { return errors.New("injected: unreachable") }
	start := time.Now()
	s := e.session(c)
	waitDone(t, s, 3*testInterval)
	took := time.Since(start)
	if took < 650*time.Millisecond || took > 850*time.Millisecond {
		t.Errorf("session ended %v after its last heartbeat, want interval less the offset (700ms)", took)
	}
}

// docs/roles.sql's worker role opens on CockroachDB's path too, with
// migrations off, without any grant on golang-migrate's lock table.
func TestLeastPrivilegeRolesCockroachPath(t *testing.T) {
	leastPrivilegeRoles(t, true)
}
