package bmdb

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// Invariant 3: on PostgreSQL, whole-transaction retries make every one of
// 8 workers x 50 increments of one hot row commit exactly once. (crdb's
// savepoint retry loses about one in six of them here.)
func TestTransactHotRowAllCommit(t *testing.T) {
	e := newEnv(t)
	e.exec("CREATE TABLE counter (id INT PRIMARY KEY, n INT NOT NULL)")
	e.exec("INSERT INTO counter VALUES (1, 0)")
	c := e.open(steady) // the subject is retries on a hot row, not expiry under load
	s := e.session(c)

	const workers, increments = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers*increments)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range increments {
				errs <- s.Transact(context.Background(), func(tx *Tx) error {
					var n int
					if err := tx.DBTX().QueryRowContext(context.Background(), "SELECT n FROM counter WHERE id = 1").Scan(&n); err != nil {
						return fmt.Errorf("reading counter: %w", err)
					}
					_, err := tx.DBTX().ExecContext(context.Background(), "UPDATE counter SET n = $1 WHERE id = 1", n+1)
					return err
				})
			}
		}()
	}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if err != nil {
			failed++
			t.Log(err)
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d transactions failed", failed, workers*increments)
	}
	if n := e.count("SELECT n FROM counter WHERE id = 1"); n != workers*increments {
		t.Errorf("counter = %d, want %d", n, workers*increments)
	}
	st := c.Stats()
	if st.TxRetries == 0 {
		t.Errorf("no serialization retries: the test did not contend")
	}
	t.Logf("attempts %d, retries %d (%d at COMMIT)", st.TxAttempts, st.TxRetries, st.TxCommitRetries)
}

// Invariant 3: a serialization failure raised by COMMIT (write skew, which
// crdb.ExecuteTx reports as success on PostgreSQL) is retried, and the
// retried transaction sees the other's commit.
func TestTransactRetriesWriteSkewAtCommit(t *testing.T) {
	e := newEnv(t)
	e.exec("CREATE TABLE oncall (doctor TEXT PRIMARY KEY, on_call BOOL NOT NULL)")
	e.exec("INSERT INTO oncall VALUES ('alice', true), ('bob', true)")
	c := e.open()
	exact(c) // the steps below are choreographed: no injected failures
	sessions := map[string]*Session{"alice": e.session(c), "bob": e.session(c)}

	// Each doctor goes off call if someone else stays on call: serially,
	// exactly one of them can. Both read, then both write, then alice
	// commits, then bob does: bob's COMMIT (after its last session check,
	// which ran before alice committed) is where PostgreSQL finds the write
	// skew.
	read := map[string]chan struct{}{"alice": make(chan struct{}), "bob": make(chan struct{})}
	aliceDone := make(chan struct{})
	wait := func(ch chan struct{}) error {
		select {
		case <-ch:
			return nil
		case <-time.After(10 * time.Second):
			return errors.New("test coordination timed out")
		}
	}
	// bobChecked: bob has run his last check before COMMIT, so that alice's
	// commit is found by bob's COMMIT, not by that check's statement.
	bobChecked := make(chan struct{})
	var bobHeld atomic.Bool
	c.leaseHooks.BeforeCommit = func(id uuid.UUID) {
		if id == sessions["bob"].ID() && bobHeld.CompareAndSwap(false, true) {
			close(bobChecked)
			_ = wait(aliceDone)
		}
	}
	goOff := func(me, other string, afterWrite func() error) error {
		attempt := 0
		return sessions[me].Transact(context.Background(), func(tx *Tx) error {
			attempt++
			ctx := context.Background()
			var on int
			if err := tx.DBTX().QueryRowContext(ctx, "SELECT count(*) FROM oncall WHERE on_call").Scan(&on); err != nil {
				return err
			}
			if attempt == 1 {
				close(read[me])
				if err := wait(read[other]); err != nil {
					return err
				}
			}
			if on < 2 {
				return nil
			}
			if _, err := tx.DBTX().ExecContext(ctx, "UPDATE oncall SET on_call = false WHERE doctor = $1", me); err != nil {
				return err
			}
			if attempt == 1 {
				return afterWrite()
			}
			return nil
		})
	}
	errs := make(chan error, 2)
	go func() {
		err := goOff("alice", "bob", func() error { return wait(bobChecked) })
		close(aliceDone)
		errs <- err
	}()
	go func() {
		errs <- goOff("bob", "alice", func() error { return nil })
	}()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("Transact: %v", err)
		}
	}
	if n := e.count("SELECT count(*) FROM oncall WHERE on_call"); n != 1 {
		t.Fatalf("%d doctors on call, want 1: write skew committed", n)
	}
	st := c.Stats()
	if c.engine == engineCockroach {
		// Cockroach mode (BMDB_TEST_COCKROACH) on PostgreSQL: bob's last
		// check before COMMIT, a statement inside the savepoint, may be
		// where PostgreSQL finds the write skew; it is restarted in place.
		if st.TxRetries == 0 {
			t.Fatalf("no retry (stats %+v): the test did not reach the write skew", st)
		}
		return
	}
	if st.TxCommitRetries == 0 {
		t.Fatalf("no retry of a COMMIT failure (stats %+v): the test did not reach that path", st)
	}
}

// Retries are bounded: a transaction that keeps failing with 40001 ends with
// *RetriesExhaustedError after MaxTxAttempts attempts.
func TestTransactRetriesExhausted(t *testing.T) {
	e := newEnv(t)
	c := e.open(func(c *Config) { c.MaxTxAttempts = 4 })
	exact(c)
	s := e.session(c)
	attempts := 0
	err := s.Transact(context.Background(), func(*Tx) error {
		attempts++
		return fmt.Errorf("wrapped: %w", &pq.Error{Code: codeSerializationFailure, Message: "injected"})
	})
	var exhausted *RetriesExhaustedError
	if !errors.Is(err, ErrRetriesExhausted) || !errors.As(err, &exhausted) {
		t.Fatalf("err = %v, want RetriesExhaustedError", err)
	}
	if attempts != 4 || exhausted.Attempts != 4 {
		t.Errorf("attempts = %d (error says %d), want 4", attempts, exhausted.Attempts)
	}
	if sqlState(exhausted.Last) != codeSerializationFailure {
		t.Errorf("Last = %v", exhausted.Last)
	}
}

// An error from fn rolls everything back, bmdb's and the application's
// queries alike, and is returned unchanged; it is not retried.
func TestTransactErrorRollsBack(t *testing.T) {
	e := newEnv(t)
	s := e.session(e.open())
	e.exec("CREATE TABLE tag (machine_id UUID PRIMARY KEY)")
	boom := errors.New("boom")
	booms := 0 // attempts that reached fn's error; in cockroach mode an injected fault may retry an attempt before that
	err := s.Transact(context.Background(), func(tx *Tx) error {
		ids, err := tx.CreateMachines(context.Background(), 1)
		if err != nil {
			return err
		}
		if _, err := tx.DBTX().ExecContext(context.Background(), "INSERT INTO tag VALUES ($1)", ids[0]); err != nil {
			return err
		}
		booms++
		return boom
	})
	if !errors.Is(err, boom) || booms != 1 {
		t.Fatalf("err = %v after fn failed %d times, want boom after 1", err, booms)
	}
	if n := e.count("SELECT (SELECT count(*) FROM machines) + (SELECT count(*) FROM tag)"); n != 0 {
		t.Fatalf("%d rows committed by a failed transaction", n)
	}
}

// A done context stops Transact before anything commits.
func TestTransactContextDone(t *testing.T) {
	e := newEnv(t)
	s := e.session(e.open())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Transact(ctx, func(tx *Tx) error {
		_, err := tx.CreateMachines(ctx, 1)
		return err
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if n := e.count("SELECT count(*) FROM machines"); n != 0 {
		t.Fatal("a cancelled transaction committed")
	}
}

// Invariant 3: the session is re-checked inside the transaction, on the
// database clock, even while the session still looks alive locally.
func TestTransactChecksSessionInDatabase(t *testing.T) {
	e := newEnv(t)
	s := e.session(e.open())
	e.expireInDB(s.ID(), time.Millisecond)
	ran := false
	err := s.Transact(context.Background(), func(tx *Tx) error {
		ran = true
		_, err := tx.CreateMachines(context.Background(), 1)
		return err
	})
	if !errors.Is(err, ErrSessionExpired) {
		t.Fatalf("err = %v, want ErrSessionExpired", err)
	}
	if ran {
		t.Error("fn ran in a transaction of an expired session")
	}
	if n := e.count("SELECT count(*) FROM machines"); n != 0 {
		t.Fatal("an expired session committed")
	}
	waitDone(t, s, time.Second) // the failed check ends the session at once
}

// A connection that fails before COMMIT (here the server terminates it in
// the middle of the transaction, as a restart or pg_terminate_backend does)
// rolled the transaction back: bmdb retries it on a new connection.
func TestTransactRetriesLostConnection(t *testing.T) {
	e := newEnv(t)
	testdb.SkipOnCockroach(t, "pg_terminate_backend is PostgreSQL's (CANCEL SESSION does not end the transaction the same way)")
	c := e.open()
	exact(c)
	s := e.session(c)
	attempts := 0
	err := s.Transact(context.Background(), func(tx *Tx) error {
		attempts++
		if _, err := tx.CreateMachines(context.Background(), 1); err != nil {
			return err
		}
		if attempts == 1 {
			_, err := tx.DBTX().ExecContext(context.Background(), "SELECT pg_terminate_backend(pg_backend_pid())")
			return fmt.Errorf("after terminating the backend: %w", err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Transact = %v after %d attempts", err, attempts)
	}
	if attempts != 2 {
		t.Errorf("%d attempts, want 2", attempts)
	}
	if n := e.count("SELECT count(*) FROM machines"); n != 1 {
		t.Errorf("%d machines committed, want 1", n)
	}
	if st := c.Stats(); st.TxConnectionRetries != 1 {
		t.Errorf("stats %+v, want one connection retry", st)
	}

}
