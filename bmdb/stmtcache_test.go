package bmdb

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// preparedCount returns how many statements with text query the
// connection running tx holds prepared.
func preparedCount(t *testing.T, tx *Tx, query string) int {
	t.Helper()
	var n int
	// No parameters: lib/pq's simple protocol, never cached itself.
	row := tx.DBTX().QueryRowContext(context.Background(),
		"SELECT count(*) FROM pg_prepared_statements WHERE statement = '"+query+"'")
	if err := row.Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// onePooledConnection opens a Connection whose pool has one connection,
// so that every transaction runs on it.
func onePooledConnection(e *env, mods ...func(*Config)) *Connection {
	return e.open(append([]func(*Config){func(c *Config) { c.MaxOpenConns = 1 }}, mods...)...)
}

// A statement with parameters is prepared once per connection, the second
// time the connection runs it, and reused by later transactions;
// StatementCacheSize < 0 prepares nothing.
func TestStatementCachePreparesOnce(t *testing.T) {
	e := newEnv(t)
	testdb.SkipOnCockroach(t, "counts statements in PostgreSQL's pg_prepared_statements")
	const query = "SELECT $1::INT8 + 1"
	for _, size := range []int{0, -1} {
		c := onePooledConnection(e, func(c *Config) { c.StatementCacheSize = size })
		exact(c)
		s := e.session(c)
		for i := range 3 {
			err := s.Transact(context.Background(), func(tx *Tx) error {
				var got int64
				if err := tx.DBTX().QueryRowContext(context.Background(), query, i).Scan(&got); err != nil {
					return err
				}
				if got != int64(i)+1 {
					t.Errorf("got %d, want %d", got, i+1)
				}
				want := 1 // prepared when run the second time
				if size < 0 || i == 0 {
					want = 0
				}
				if n := preparedCount(t, tx, query); n != want {
					t.Errorf("StatementCacheSize %d, transaction %d: %d prepared statements of %q, want %d", size, i, n, query, want)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}

// The cache holds at most StatementCacheSize statements per connection:
// the least recently used are closed on the server.
func TestStatementCacheIsBounded(t *testing.T) {
	e := newEnv(t)
	testdb.SkipOnCockroach(t, "counts statements in PostgreSQL's pg_prepared_statements")
	c := onePooledConnection(e, func(c *Config) { c.StatementCacheSize = 3 })
	exact(c)
	s := e.session(c)
	for i := range 10 {
		err := s.Transact(context.Background(), func(tx *Tx) error {
			for range 2 { // prepared the second time
				if _, err := tx.DBTX().ExecContext(context.Background(), fmt.Sprintf("SELECT $1::INT8 + %d", i), i); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	err := s.Transact(context.Background(), func(tx *Tx) error {
		var n int
		err := tx.DBTX().QueryRowContext(context.Background(),
			"SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE 'SELECT $1::INT8 + %'").Scan(&n)
		if err == nil && n != 3 {
			t.Errorf("%d statements prepared, want the 3 most recent", n)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := (Config{DSN: e.dsn, ComponentName: "x", StatementCacheSize: 10001}).validate(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("StatementCacheSize 10001: %v, want ErrInvalidArgument", err)
	}
}

// A cached statement whose result columns changed (ALTER TABLE) or that
// was deallocated is prepared again: a transaction retries, a call outside
// one runs again at once; neither returns an error.
func TestStaleCachedStatementIsPreparedAgain(t *testing.T) {
	e := newEnv(t)
	c := onePooledConnection(e)
	exact(c) // counts retries
	s := e.session(c)
	e.exec("CREATE TABLE t (a INT8 PRIMARY KEY)")
	e.exec("INSERT INTO t VALUES (1)")
	const query = "SELECT * FROM t WHERE a = $1"
	columns := func() (int, error) {
		var n int
		err := s.Transact(context.Background(), func(tx *Tx) error {
			rows, err := tx.DBTX().QueryContext(context.Background(), query, 1)
			if err != nil {
				return err
			}
			defer rows.Close()
			cols, err := rows.Columns()
			n = len(cols)
			return err
		})
		return n, err
	}
	for range 2 { // prepared the second time
		if n, err := columns(); err != nil || n != 1 {
			t.Fatalf("before ALTER: %d columns, %v", n, err)
		}
	}
	e.exec("ALTER TABLE t ADD COLUMN b TEXT")
	retries := c.Stats().TxRetries
	if n, err := columns(); err != nil || n != 2 {
		t.Fatalf("after ALTER: %d columns, %v; want 2, nil", n, err)
	}
	if got := c.Stats().TxRetries - retries; got != 1 {
		t.Errorf("%d retries, want 1 (the attempt with the stale statement)", got)
	}

	// Outside a transaction.
	e.exec("ALTER TABLE t ADD COLUMN c TEXT")
	rows, err := c.DB().QueryContext(context.Background(), query, 1)
	if err != nil {
		t.Fatalf("after a second ALTER, outside a transaction: %v", err)
	}
	cols, _ := rows.Columns()
	rows.Close()
	if len(cols) != 3 {
		t.Errorf("%d columns, want 3", len(cols))
	}

	// Deallocated by the application, bmdb's own statements too: the
	// connection is replaced, and the transaction retried on the new one.
	if !testdb.Cockroach() {
		if _, err := c.DB().ExecContext(context.Background(), "DEALLOCATE ALL"); err != nil {
			t.Fatal(err)
		}
		if n, err := columns(); err != nil || n != 3 {
			t.Fatalf("after DEALLOCATE ALL: %d columns, %v; want 3, nil", n, err)
		}
	}
}

// A cached statement whose parameter types no longer fit its table (ALTER
// COLUMN TYPE) fails at most once, and is prepared anew for the next call.
func TestCachedStatementAfterColumnTypeChange(t *testing.T) {
	e := newEnv(t)
	testdb.SkipOnCockroach(t, "ALTER COLUMN TYPE runs in a job there")
	c := onePooledConnection(e)
	exact(c)
	e.exec("CREATE TABLE t (a TEXT)")
	e.exec(`INSERT INTO t VALUES ('{"k": 1}')`)
	const query = "SELECT count(*) FROM t WHERE a = $1"
	count := func() (int, error) {
		var n int
		err := c.DB().QueryRowContext(context.Background(), query, `{"k": 1}`).Scan(&n)
		return n, err
	}
	for range 2 { // prepared the second time
		if n, err := count(); err != nil || n != 1 {
			t.Fatalf("before ALTER: %d, %v", n, err)
		}
	}
	e.exec("ALTER TABLE t ALTER COLUMN a TYPE JSONB USING a::JSONB")
	n, err := count()
	if err != nil {
		n, err = count()
	}
	if err != nil || n != 1 {
		t.Fatalf("after ALTER COLUMN TYPE, twice: %d, %v; want 1, nil", n, err)
	}
}
