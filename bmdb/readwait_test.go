package bmdb

import (
	"context"
	"testing"
	"time"

	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// On CockroachDB a session check, a plain read, waits for a transaction
// that wrote the session row and has not ended (an in-flight heartbeat, a
// takeover), and times out at lock_timeout (55P03), which is retried;
// cockroach mode emulates it. PostgreSQL's check does not wait for such a
// writer (its FOR KEY SHARE does not conflict with an UPDATE of non-key
// columns).
func TestCockroachSessionCheckWaitsForWriter(t *testing.T) {
	e := newEnv(t)
	interval := 2 * time.Second // lock_timeout interval/4
	check := func(mod func(*Config)) (retried bool, took time.Duration) {
		t.Helper()
		c := e.open(mod, func(c *Config) { c.SessionInterval = interval })
		exact(c)
		s := e.session(c)
		// A writer of the session row that has not committed.
		writer, err := e.db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		defer writer.Rollback()
		if _, err := writer.Exec("UPDATE sessions SET runtime_info = runtime_info WHERE session_id = $1", s.ID()); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- s.Transact(context.Background(), func(*Tx) error { return nil }) }()
		for deadline := time.Now().Add(5 * time.Second); ; {
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Transact: %v", err)
				}
				return retried, time.Since(start)
			case <-time.After(10 * time.Millisecond):
			}
			if !retried && c.Stats().TxRetries > 0 {
				retried = true
				_ = writer.Rollback() // the writer ends: the retry goes through
			}
			if time.Now().After(deadline) {
				t.Fatal("Transact did not end")
			}
		}
	}
	retried, took := check(withMode(crdbmode.Settings{Enabled: true}))
	if !retried || took < interval/4 {
		t.Errorf("cockroach mode: the check did not wait for the writer and time out (retried %v, took %v)", retried, took)
	}
	if testdb.Cockroach() {
		return
	}
	retried, took = check(withMode(crdbmode.Settings{}))
	if retried || took >= interval/4 {
		t.Errorf("PostgreSQL: the check waited for the writer (retried %v, took %v)", retried, took)
	}
}
