package migrations

import (
	"strings"
	"testing"

	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// work_history.id is spread on CockroachDB (unordered_unique_rowid(), not
// the time-ordered unique_rowid() BIGSERIAL gives there) and keeps its
// sequence on PostgreSQL, cockroach mode included.
func TestHistoryIDSpreadOnCockroachOnly(t *testing.T) {
	t.Parallel()
	db := openRaw(t, testdb.New(t))
	var def string
	if err := db.QueryRow(`SELECT column_default FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = 'work_history' AND column_name = 'id'`).Scan(&def); err != nil {
		t.Fatal(err)
	}
	want := "nextval("
	if testdb.Cockroach() {
		want = "unordered_unique_rowid()"
	}
	if !strings.Contains(def, want) {
		t.Errorf("work_history.id defaults to %q, want %s", def, want)
	}
}
