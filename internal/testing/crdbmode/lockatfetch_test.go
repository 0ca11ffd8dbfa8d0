package crdbmode_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// A lock-at-fetch scan that fails after its first row (here the second
// row changed after the snapshot: PostgreSQL's 40001 on locking it) fails
// the statement with that error, as CockroachDB's scan would, and not
// with a later 25P02 of the statement itself. (Before, the error was
// dropped: the chaos harness's first claims in cockroach mode failed with
// "current transaction is aborted" instead of a retryable conflict.)
func TestLockAtFetchKeepsTheScansError(t *testing.T) {
	dsn := testdb.NewEmpty(t)
	ctx := context.Background()
	plain, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.Exec("CREATE TABLE t (id INT8 PRIMARY KEY, v INT8); INSERT INTO t VALUES (1, 0), (2, 0)"); err != nil {
		t.Fatal(err)
	}
	connector, err := dbconn.NewConnector(dsn, 10*time.Second, dbconn.Settings{}, crdbmode.New(crdbmode.Settings{Enabled: true}, nil).Wrap)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(connector)
	defer db.Close()

	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "SAVEPOINT cockroach_restart"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 2 {
		t.Fatalf("snapshot: %d rows, %v", n, err)
	}
	if _, err := plain.Exec("UPDATE t SET v = 1 WHERE id = 2"); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.QueryContext(ctx, "SELECT id FROM t WHERE id = ANY ($1) ORDER BY id FOR UPDATE", pq.Array([]int64{1, 2}))
	if err == nil {
		for rows.Next() {
		}
		err = rows.Err()
		rows.Close()
	}
	if got := dbconn.SQLState(err); got != dbconn.CodeSerializationFailure {
		t.Fatalf("locking read of a row changed after the snapshot: %v (SQLSTATE %q), want 40001", err, got)
	}
}
