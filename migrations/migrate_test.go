package migrations

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

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
	migrateTo(t, migrator(t, dsn, nil, cockroach(0)), 11)
	// 000012: DROP VIEW IF EXISTS, CREATE OR REPLACE VIEW, INSERT: stop
	// before the INSERT.
	_, err := migrator(t, dsn, nil, cockroach(2)).Up(ctx)
	if err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("Up with a failure between statements = %v", err)
	}
	next := migrator(t, dsn, nil, cockroach(0))
	if v := version(t, next, SchemaBmdb); v.Database != 12 || !v.Dirty {
		t.Fatalf("version after the failure = %+v; want 12, dirty", v)
	}
	db := openRaw(t, dsn)
	var compat int
	db.QueryRow("SELECT count(*) FROM bmdb_schema_compat WHERE version = 12").Scan(&compat)
	if !exists(t, dsn, "machine_overview") || compat != 0 {
		t.Fatalf("the file did not half-apply: view %v, compat rows %d", exists(t, dsn, "machine_overview"), compat)
	}

	if _, err := next.Up(ctx); err != nil {
		t.Fatalf("Up after the half-applied migration: %v", err)
	}
	if v := version(t, next, SchemaBmdb); v.Dirty || v.Database < 12 {
		t.Fatalf("version after recovery = %+v; want 12 or later, clean", v)
	}
	db.QueryRow("SELECT count(*) FROM bmdb_schema_compat WHERE version = 12").Scan(&compat)
	if compat != 1 {
		t.Errorf("%d compat rows of version 12 after recovery, want 1", compat)
	}
}

// A dirty version whose file is not marked safe to run again is refused,
// with a message naming the version table and what the file created; marked,
// the same file is run again.
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
		app := &Application{Name: "racks", Migrations: fstest.MapFS{
			"000001_racks.up.sql":   {Data: []byte(body)},
			"000001_racks.down.sql": {Data: []byte("DROP TABLE rack_slots; DROP TABLE racks;")},
		}}
		if _, err := migrator(t, dsn, app, cockroach(1)).Up(ctx); err == nil {
			t.Fatalf("marked %v: Up with a failure between statements succeeded", marked)
		}
		if !exists(t, dsn, "racks") || exists(t, dsn, "rack_slots") {
			t.Fatalf("marked %v: the file did not half-apply", marked)
		}
		_, err := migrator(t, dsn, app, cockroach(0)).Up(ctx)
		var verr *SchemaVersionError
		switch {
		case marked && err != nil:
			t.Errorf("marked: Up after the failure = %v, want the file run again", err)
		case marked && !exists(t, dsn, "rack_slots"):
			t.Errorf("marked: rack_slots missing after recovery")
		case !marked && (!errors.As(err, &verr) || !errors.Is(err, ErrSchemaDirty) || !strings.Contains(err.Error(), rerunnableMarker)):
			t.Errorf("unmarked: Up after the failure = %v, want ErrSchemaDirty naming the marker", err)
		case !marked && (verr.Table != "racks_schema_migrations" || !strings.Contains(err.Error(), "racks_schema_migrations")):
			t.Errorf("unmarked: the error does not name the version table: %v", err)
		case !marked && !strings.Contains(err.Error(), "these exist: table racks; these do not: table rack_slots"):
			t.Errorf("unmarked: the error does not say what exists: %v", err)
		}
		t.Logf("marked %v: %v", marked, err)
	}
}

// bmdb's first migration is safe to run again too, on both engines:
// stopped between two statements (emulated in cockroach mode, where
// CockroachDB 25.x commits each DDL statement on its own), or dirty with
// all of it applied (a migrator cut off after its server finished the
// file), or with part of it dropped, the next Up runs it again and goes
// on. (Before, a dirty 000001 was refused until an operator repaired it:
// PostgreSQL has no CREATE TYPE IF NOT EXISTS.)
func TestFirstMigrationRecovers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		mode  crdbmode.Settings
		setup string // run after migrating to version 1, leaving it dirty
	}{
		{"cockroach, stopped after the type", cockroach(6), ""},
		{"cockroach, stopped after two statements", cockroach(2), ""},
		{"applied in full", plain, "UPDATE schema_migrations SET dirty = true"},
		{"applied in part", plain, "DROP TABLE work_backoff; DROP TABLE work_history; UPDATE schema_migrations SET dirty = true"},
		{"cockroach, applied in full", cockroach(0), "UPDATE schema_migrations SET dirty = true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testdb.SkipOnCockroach(t, "emulates the failures in cockroach mode")
			dsn := testdb.NewEmpty(t)
			if tc.setup == "" {
				_, err := migrator(t, dsn, nil, tc.mode).Up(ctx)
				if err == nil || !strings.Contains(err.Error(), "injected") {
					t.Fatalf("Up with a failure in 000001 = %v", err)
				}
			} else {
				migrateTo(t, migrator(t, dsn, nil, tc.mode), 1)
				if _, err := openRaw(t, dsn).Exec(tc.setup); err != nil {
					t.Fatal(err)
				}
			}
			tc.mode.MigrationFailAfter = 0
			m := migrator(t, dsn, nil, tc.mode)
			if v := version(t, m, SchemaBmdb); v.Database != 1 || !v.Dirty {
				t.Fatalf("version before recovery = %+v; want 1, dirty", v)
			}
			if _, err := m.Up(ctx); err != nil {
				t.Fatalf("Up of a dirty 000001: %v", err)
			}
			if v := version(t, m, SchemaBmdb); v.Dirty || v.Database != v.Binary {
				t.Fatalf("version after recovery = %+v", v)
			}
			for _, table := range []string{"machines", "sessions", "work", "work_history", "work_backoff", "work_fencing"} {
				if !exists(t, dsn, table) {
					t.Errorf("table %s missing after recovery", table)
				}
			}
		})
	}
}

// The files golang-migrate runs carry each CREATE TYPE in the engine's
// idempotent form, and only bmdb's; sqlc and Schema read them as written.
func TestIdempotentTypes(t *testing.T) {
	t.Parallel()
	body, err := fs.ReadFile(typesFS{FS: FS}, "000001_init.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := fs.ReadFile(FS, "000001_init.up.sql")
	if !strings.Contains(string(raw), "\nCREATE TYPE work_history_event AS ENUM (") {
		t.Fatalf("000001 no longer creates work_history_event as this test expects")
	}
	const pg = "DO $bmdb$ BEGIN CREATE TYPE work_history_event AS ENUM ('Started', 'Finished', 'Canceled', 'Failed', 'Abandoned'); EXCEPTION WHEN duplicate_object THEN NULL; END $bmdb$;"
	if !strings.Contains(string(body), pg) {
		t.Errorf("PostgreSQL's 000001 lacks %q:\n%s", pg, body)
	}
	cr, err := fs.ReadFile(typesFS{FS: FS, cockroach: true}, "000001_init.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cr), "\nCREATE TYPE IF NOT EXISTS work_history_event AS ENUM (") {
		t.Errorf("CockroachDB's 000001 lacks CREATE TYPE IF NOT EXISTS:\n%s", cr)
	}
	if got := idempotentTypes("-- CREATE TYPE x AS ENUM ('a');\nCREATE TYPE IF NOT EXISTS y AS ENUM ('b');\n", false); got != "-- CREATE TYPE x AS ENUM ('a');\nCREATE TYPE IF NOT EXISTS y AS ENUM ('b');\n" {
		t.Errorf("idempotentTypes rewrote a comment or an idempotent statement: %q", got)
	}
}

// An application's migration that adds a column and a partial index on
// it, as bmdb's 000015 does, applies on every CockroachDB version, and
// reverts: its statements run one by one there. (Before, the file was one
// transaction on 23.2/24.x and on 25.x with autocommit_before_ddl off,
// refused with 0A000, and left dirty for good.)
func TestCockroachApplicationPartialIndex(t *testing.T) {
	t.Parallel()
	testdb.SkipOnCockroach(t, "emulates each version")
	off := false
	app := &Application{Name: "racks", Migrations: fstest.MapFS{
		"000001_racks.up.sql":   {Data: []byte("CREATE TABLE IF NOT EXISTS racks (id INT8 PRIMARY KEY, name TEXT NOT NULL);\n")},
		"000001_racks.down.sql": {Data: []byte("DROP TABLE IF EXISTS racks;\n")},
		"000002_retired.up.sql": {Data: []byte("-- bmdb:rerunnable\nALTER TABLE racks ADD COLUMN IF NOT EXISTS retired_at TIMESTAMPTZ;\n" +
			"CREATE UNIQUE INDEX IF NOT EXISTS racks_live_name_idx ON racks (name) WHERE retired_at IS NULL;\n")},
		"000002_retired.down.sql": {Data: []byte("DROP INDEX IF EXISTS racks_live_name_idx;\nALTER TABLE racks DROP COLUMN IF EXISTS retired_at;\n")},
	}}
	for _, mode := range []struct {
		name string
		s    crdbmode.Settings
	}{
		{"23.2", crdbmode.Settings{Enabled: true, Version: crdbmode.Version{Major: 23, Minor: 2}}},
		{"24.1", crdbmode.Settings{Enabled: true, Version: crdbmode.Version{Major: 24, Minor: 1}}},
		{"25.2, autocommit_before_ddl off", crdbmode.Settings{Enabled: true, AutocommitBeforeDDL: &off}},
		{"25.2", crdbmode.Settings{Enabled: true}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := testdb.New(t)
			m := migrator(t, dsn, app, mode.s)
			if _, err := m.Up(ctx); err != nil {
				t.Fatalf("Up: %v", err)
			}
			if v := version(t, m, "racks"); v.Dirty || v.Database != 2 || !exists(t, dsn, "racks_live_name_idx") {
				t.Fatalf("after Up: %+v, index %v", v, exists(t, dsn, "racks_live_name_idx"))
			}
			if _, err := m.Down(ctx, "racks", 1); err != nil {
				t.Fatalf("Down: %v", err)
			}
			if _, err := m.Up(ctx); err != nil {
				t.Fatalf("Up after Down: %v", err)
			}
			if v := version(t, m, "racks"); v.Dirty || v.Database != 2 || !exists(t, dsn, "racks_live_name_idx") {
				t.Fatalf("after Down and Up: %+v", v)
			}
		})
	}
}
