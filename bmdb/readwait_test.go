package bmdb

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

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

// On CockroachDB a plain read waits for a transaction holding an exclusive
// lock on a row it reads (kv.lock.exclusive_locks_block_non_locking_reads
// .enabled, on by default), and times out at lock_timeout (55P03, retried);
// cockroach mode emulates it for the plain SELECTs of bmdb's transactions.
// So a retrieval that read a row claims lock would wait for every claim in
// flight: claims lock their work_fencing rows, which the usual retrieval
// (MachinesWithoutWork) does not read, and not the machines rows, which it
// does. PostgreSQL's plain reads wait for nothing.
func TestCockroachReadsWaitForExclusiveLocks(t *testing.T) {
	e := newEnv(t)
	interval := 2 * time.Second // lock_timeout interval/4
	m := e.machine()
	e.fence("install", m)
	// read runs a retrieval reading m while another transaction holds
	// lock, and reports whether it timed out (and was retried) and how
	// long it took.
	read := func(mod func(*Config), lock string, retrieve func(*Tx) ([]uuid.UUID, error)) (retried bool, took time.Duration) {
		t.Helper()
		c := e.open(mod, func(c *Config) { c.SessionInterval = interval })
		exact(c)
		s := e.session(c)
		holder, err := e.db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback()
		if _, err := holder.Exec(lock, m); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		done := make(chan error, 1)
		go func() {
			done <- s.Transact(context.Background(), func(tx *Tx) error {
				_, err := retrieve(tx)
				return err
			})
		}()
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
				_ = holder.Rollback() // the lock goes: the retry goes through
			}
			if time.Now().After(deadline) {
				t.Fatal("Transact did not end")
			}
		}
	}
	lockMachine := "SELECT 1 FROM machines WHERE machine_id = $1 FOR UPDATE"
	lockClaimRow := "SELECT 1 FROM work_fencing WHERE machine_id = $1 AND process = 'install' FOR UPDATE"
	readMachine := func(tx *Tx) ([]uuid.UUID, error) {
		var id uuid.UUID
		err := tx.DBTX().QueryRowContext(context.Background(), "SELECT machine_id FROM machines WHERE machine_id = $1", m).Scan(&id)
		return []uuid.UUID{id}, err
	}
	readClaimRow := func(tx *Tx) ([]uuid.UUID, error) {
		var id uuid.UUID
		err := tx.DBTX().QueryRowContext(context.Background(), "SELECT machine_id FROM work_fencing WHERE machine_id = $1 AND process = 'install'", m).Scan(&id)
		return []uuid.UUID{id}, err
	}
	crdb := withMode(crdbmode.Settings{Enabled: true})
	for _, tc := range []struct {
		name     string
		lock     string
		retrieve func(*Tx) ([]uuid.UUID, error)
		waits    bool
	}{
		{"a read of a machine locked FOR UPDATE", lockMachine, readMachine, true},
		{"a read of a claim row a claim locks", lockClaimRow, readClaimRow, true},
		{"the usual retrieval while a claim is in flight", lockClaimRow, retrieveIdle("install"), false},
	} {
		retried, took := read(crdb, tc.lock, tc.retrieve)
		if waited := retried && took >= interval/4; waited != tc.waits {
			t.Errorf("cockroach mode, %s: waited %v (retried %v, took %v), want %v", tc.name, waited, retried, took, tc.waits)
		}
	}
	if testdb.Cockroach() {
		return
	}
	retried, took := read(withMode(crdbmode.Settings{}), lockMachine, readMachine)
	if retried || took >= interval/4 {
		t.Errorf("PostgreSQL: a plain read waited for an exclusive lock (retried %v, took %v)", retried, took)
	}
}
