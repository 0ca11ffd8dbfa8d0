package migrate

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/bmdb-dev/bmdb/internal/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/testdb"
)

// cockroach is the target dsn in cockroach mode, failing the next
// multi-statement migration file after failAfter statements (0: never).
func cockroach(dsn string, failAfter int) Target {
	return Target{DSN: dsn, NetworkTimeout: 5 * time.Second, Mode: crdbmode.Settings{Enabled: true, MigrationFailAfter: failAfter}}
}

// exists reports whether a relation named name exists.
func exists(t *testing.T, dsn, name string) bool {
	t.Helper()
	var ok bool
	if err := openRaw(t, dsn).QueryRow("SELECT to_regclass($1) IS NOT NULL", name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// On CockroachDB a migration file is applied one statement at a time and
// can stop between two, leaving part of it applied and its version dirty
// (emulated in cockroach mode). bmdb's files are safe to run again, so the
// next migration forces the previous version and runs the file again.
// (Before, every later Open refused the dirty schema until an operator
// repaired it.)
func TestCockroachHalfAppliedMigrationRecovers(t *testing.T) {
	t.Parallel()
	testdb.SkipOnCockroach(t, "emulates a failure between two statements")
	dsn := testdb.NewEmpty(t)
	ctx := context.Background()
	src, err := BmdbSource()
	if err != nil {
		t.Fatal(err)
	}
	if err := To(ctx, cockroach(dsn, 0), src, 11); err != nil {
		t.Fatal(err)
	}
	// 000012: DROP VIEW IF EXISTS, CREATE OR REPLACE VIEW, INSERT: stop
	// before the INSERT.
	err = Up(ctx, cockroach(dsn, 2), "half")
	if err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("Up with a failure between statements = %v", err)
	}
	db := openRaw(t, dsn)
	v, err := ReadVersion(ctx, db, src)
	if err != nil || v != (Version{Version: 12, Dirty: true}) {
		t.Fatalf("version after the failure = %+v, %v; want 12, dirty", v, err)
	}
	var compat int
	db.QueryRow("SELECT count(*) FROM bmdb_schema_compat WHERE version = 12").Scan(&compat)
	if !exists(t, dsn, "machine_overview") || compat != 0 {
		t.Fatalf("the file did not half-apply: view %v, compat rows %d", exists(t, dsn, "machine_overview"), compat)
	}

	if err := Up(ctx, cockroach(dsn, 0), "next"); err != nil {
		t.Fatalf("Up after the half-applied migration: %v", err)
	}
	if v, err := ReadVersion(ctx, db, src); err != nil || v.Dirty || v.Version < 12 {
		t.Fatalf("version after recovery = %+v, %v; want 12 or later, clean", v, err)
	}
	db.QueryRow("SELECT count(*) FROM bmdb_schema_compat WHERE version = 12").Scan(&compat)
	if compat != 1 {
		t.Errorf("%d compat rows of version 12 after recovery, want 1", compat)
	}
}

// A dirty version whose file is not marked safe to run again is refused,
// with a message saying what to repair; marked, the same file is run again.
func TestCockroachDirtyApplicationMigration(t *testing.T) {
	t.Parallel()
	testdb.SkipOnCockroach(t, "emulates a failure between two statements")
	ctx := context.Background()
	for _, marked := range []bool{false, true} {
		dsn := testdb.New(t)
		body := "CREATE TABLE IF NOT EXISTS racks (id INT8 PRIMARY KEY);\nCREATE TABLE IF NOT EXISTS rack_slots (rack INT8 NOT NULL, slot INT8 NOT NULL, PRIMARY KEY (rack, slot));\n"
		if marked {
			body = "-- bmdb:rerunnable\n" + body
		}
		files := fstest.MapFS{
			"000001_racks.up.sql":   {Data: []byte(body)},
			"000001_racks.down.sql": {Data: []byte("DROP TABLE rack_slots; DROP TABLE racks;")},
		}
		srcs, err := Sources("racks", files)
		if err != nil {
			t.Fatal(err)
		}
		db := openRaw(t, dsn)
		if err := OnOpen(ctx, db, cockroach(dsn, 1), "half", true, srcs); err == nil {
			t.Fatalf("marked %v: OnOpen with a failure between statements succeeded", marked)
		}
		if !exists(t, dsn, "racks") || exists(t, dsn, "rack_slots") {
			t.Fatalf("marked %v: the file did not half-apply", marked)
		}
		err = OnOpen(ctx, db, cockroach(dsn, 0), "next", true, srcs)
		var verr *SchemaVersionError
		switch {
		case marked && err != nil:
			t.Errorf("marked: OnOpen after the failure = %v, want the file run again", err)
		case marked && !exists(t, dsn, "rack_slots"):
			t.Errorf("marked: rack_slots missing after recovery")
		case !marked && (!errors.As(err, &verr) || !errors.Is(err, ErrSchemaDirty) || !strings.Contains(err.Error(), rerunnableMarker)):
			t.Errorf("unmarked: OnOpen after the failure = %v, want ErrSchemaDirty naming the marker", err)
		}
		t.Logf("marked %v: %v", marked, err)
	}
}
