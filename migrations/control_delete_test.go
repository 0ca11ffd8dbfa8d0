package migrations

import (
	"context"
	"strings"
	"testing"

	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// 000016 (controls deleted): on CockroachDB its statements run one at a
// time (emulated in cockroach mode); stopped after any of them, the file
// runs again and ends with the one CHECK that allows 'delete' and refuses
// what no action is, and one compat row. Its down file removes the
// deletions' records and the action.
func TestControlDeleteMigrationReruns(t *testing.T) {
	t.Parallel()
	testdb.SkipOnCockroach(t, "emulates a failure between two statements")
	ctx := context.Background()
	for stop := 1; stop <= 3; stop++ {
		dsn := testdb.NewEmpty(t)
		db := openRaw(t, dsn)
		migrateTo(t, migrator(t, dsn, nil, cockroach(0)), 15)
		if _, err := db.Exec("INSERT INTO process_control_history (process, action, actor) VALUES ('burn-in', 'pause', 'alice')"); err != nil {
			t.Fatal(err)
		}
		if _, err := migrator(t, dsn, nil, cockroach(stop)).Up(ctx); err == nil || !strings.Contains(err.Error(), "injected") {
			t.Fatalf("stop after %d: Up = %v, want the injected failure", stop, err)
		}
		m := migrator(t, dsn, nil, cockroach(0))
		if v := version(t, m, SchemaBmdb); v.Database != 16 || !v.Dirty {
			t.Fatalf("stop after %d: version %+v, want 16, dirty", stop, v)
		}
		if _, err := m.Up(ctx); err != nil {
			t.Fatalf("stop after %d: Up again: %v", stop, err)
		}
		if _, err := db.Exec("INSERT INTO process_control_history (process, action, actor) VALUES ('burn-in', 'delete', 'alice')"); err != nil {
			t.Errorf("stop after %d: a delete record is refused: %v", stop, err)
		}
		if _, err := db.Exec("INSERT INTO process_control_history (process, action, actor) VALUES ('burn-in', 'bogus', 'alice')"); err == nil {
			t.Errorf("stop after %d: an unknown action is accepted", stop)
		}
		var checks, compat int
		db.QueryRow(`SELECT count(*) FROM pg_constraint WHERE conrelid = 'process_control_history'::regclass AND contype = 'c'`).Scan(&checks)
		db.QueryRow("SELECT count(*) FROM bmdb_schema_compat WHERE version = 16 AND oldest_compatible = 14").Scan(&compat)
		if checks != 1 || compat != 1 {
			t.Errorf("stop after %d: %d CHECKs on process_control_history, %d compat rows; want 1 and 1", stop, checks, compat)
		}
		if stop > 1 {
			continue
		}
		migrateTo(t, m, 15) // 000016's down, and any later file's first
		var deletes, pauses int
		db.QueryRow("SELECT count(*) FILTER (WHERE action = 'delete'), count(*) FILTER (WHERE action = 'pause') FROM process_control_history").Scan(&deletes, &pauses)
		if deletes != 0 || pauses != 1 {
			t.Errorf("after Down: %d delete records, %d pauses; want 0 and 1", deletes, pauses)
		}
		if _, err := db.Exec("INSERT INTO process_control_history (process, action, actor) VALUES ('burn-in', 'delete', 'alice')"); err == nil {
			t.Errorf("after Down: a delete record is accepted")
		}
	}
}
