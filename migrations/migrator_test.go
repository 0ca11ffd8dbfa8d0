package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// plain is no cockroach mode.
var plain = crdbmode.Settings{}

// bmdbTables counts bmdb's first tables in db.
func bmdbTables(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	err := db.QueryRow(`SELECT count(*) FROM information_schema.tables
		WHERE table_schema = current_schema() AND table_name IN ('machines', 'sessions', 'work', 'work_history', 'work_backoff')`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Up, Down and Check on an empty database: up, down one step, all the way
// down, up again; the versions and the checks follow.
func TestMigratorUpDownUp(t *testing.T) {
	t.Parallel()
	dsn := testdb.NewEmpty(t)
	db := openRaw(t, dsn)
	ctx := context.Background()
	m := migrator(t, dsn, nil, plain)
	latest := m.srcs[0].latest
	if v := version(t, m, SchemaBmdb); v.Database != 0 || v.Binary != latest || v.Table != "schema_migrations" || v.Dirty || !errors.Is(v.Err, ErrSchemaTooOld) {
		t.Fatalf("Versions of an empty database = %+v", v)
	}
	if err := m.Check(ctx); !errors.Is(err, ErrSchemaTooOld) {
		t.Fatalf("Check of an empty database = %v, want ErrSchemaTooOld", err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if n := bmdbTables(t, db); n != 5 {
		t.Fatalf("%d tables after Up, want 5", n)
	}
	if err := m.Check(ctx); err != nil {
		t.Fatalf("Check after Up = %v", err)
	}
	if _, err := m.Down(ctx, SchemaBmdb, 1); err != nil {
		t.Fatalf("Down 1: %v", err)
	}
	if v := version(t, m, SchemaBmdb); v.Database != latest-1 || v.Dirty {
		t.Errorf("after one step down: %+v", v)
	}
	for _, tc := range []struct {
		schema string
		steps  int
		want   string
	}{
		{SchemaBmdb, 0, "steps is 0, must be positive"},
		{SchemaBmdb, int(latest), "has " + itoa(latest-1) + " migrations applied"},
		{"racks", 1, `schema "racks" is not one this Migrator has the files of`},
	} {
		if _, err := m.Down(ctx, tc.schema, tc.steps); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Down(%q, %d) = %v, want ErrInvalidArgument with %q", tc.schema, tc.steps, err, tc.want)
		}
	}
	if _, err := m.Down(ctx, SchemaBmdb, int(latest-1)); err != nil {
		t.Fatalf("Down to nothing: %v", err)
	}
	if n := bmdbTables(t, db); n != 0 {
		t.Fatalf("%d tables after Down to nothing", n)
	}
	for range 2 {
		if _, err := m.Up(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if v := version(t, m, SchemaBmdb); v.Database != latest || v.Dirty || v.Err != nil {
		t.Errorf("after up: %+v", v)
	}
}

func itoa(v uint) string { return strconv.FormatUint(uint64(v), 10) }

// New refuses bad input before connecting, naming what is wrong.
func TestNewRejectsBadInput(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("postgres", "postgres://u@127.0.0.1:1/db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, tc := range []struct {
		db   *sql.DB
		cfg  *Config
		want string
	}{
		{nil, nil, "New: db is nil"},
		{db, &Config{HolderInfo: "a\x00b"}, "Config.HolderInfo is not valid UTF-8"},
		{db, &Config{HolderInfo: strings.Repeat("x", MaxHolderInfoLength+1)}, "Config.HolderInfo is 4097 bytes long"},
		{db, &Config{Application: &Application{Name: "Racks", Migrations: appFiles(nil)}}, `Application.Name "Racks" must be`},
		{db, &Config{Application: &Application{Name: "racks", Migrations: appFiles(nil)}}, `Config.Application "racks": migrations: reading the migrations of application racks`},
		{db, &Config{Application: &Application{Name: "racks", Migrations: appFiles(map[string]string{"000001_a": "", "000001_b": ""})}}, `Config.Application "racks"`},
	} {
		_, err := New(tc.db, tc.cfg)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%v, %+v) = %v, want ErrInvalidArgument with %q", tc.db, tc.cfg, err, tc.want)
		}
	}
	if _, err := New(db, nil); err != nil {
		t.Errorf("New(db, nil) = %v", err)
	}
}

// Force accepts only versions it knows, names the ones it does, and
// records a known one without running anything.
func TestForceChecksVersion(t *testing.T) {
	t.Parallel()
	dsn := testdb.New(t)
	ctx := context.Background()
	m := migrator(t, dsn, nil, plain)
	latest := m.srcs[0].latest
	for _, tc := range []struct {
		schema  string
		version uint
		want    string
	}{
		{SchemaBmdb, latest + 1, "is not one of the migrations of bmdb's schema: want 0 (none applied) or one of 1-" + itoa(latest)},
		{"Racks!", 1, `schema "Racks!" is neither "bmdb" nor an application's name`},
		{"ghost", 1, `application "ghost" has no version table ghost_schema_migrations`},
	} {
		if _, err := m.Force(ctx, tc.schema, tc.version); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Force(%q, %d) = %v, want ErrInvalidArgument with %q", tc.schema, tc.version, err, tc.want)
		}
	}
	before, err := m.Force(ctx, SchemaBmdb, latest)
	if err != nil || before.Database != latest || before.Dirty || before.Table != "schema_migrations" {
		t.Fatalf("Force(bmdb, %d) = %+v, %v", latest, before, err)
	}
	if v := version(t, m, SchemaBmdb); v.Database != latest || v.Dirty {
		t.Errorf("after Force: %+v", v)
	}
	if got := versionList([]uint{1, 2, 3, 5, 7, 8}); got != "1-3, 5, 7-8" {
		t.Errorf("versionList = %q", got)
	}
}

// firmwareV1 and firmwareV2 are an application's migrations; 000002 is
// slow (pg_sleep) and not marked safe to run again.
var (
	firmwareV1 = map[string]string{
		"000001_firmware": "CREATE TABLE firmware (machine_id UUID PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE, version TEXT NOT NULL);",
	}
	firmwareV2 = map[string]string{
		"000001_firmware": firmwareV1["000001_firmware"],
		"000002_firmware_blobs": `-- Slow: the blob table takes a while.
CREATE TABLE firmware_blobs (sha TEXT PRIMARY KEY, size INT8 NOT NULL);
SELECT pg_sleep(3);
CREATE INDEX firmware_blobs_size_idx ON firmware_blobs (size);
ALTER TABLE firmware ADD COLUMN blob_sha TEXT;
`,
	}
)

// The case: the client of an application's slow migration is cut
// off (its ctx ends, as on SIGTERM) while the server runs the file; the
// server finishes it, and the version stays dirty. The next Up takes the
// dead migrator's lease over, and refuses the dirty schema with an error
// that names the version table, lists what the file creates and finds
// all of it there: the schema matches version 2, not 1. Forcing 2 and
// migrating up succeeds.
func TestDirtyApplicationFinishedByServer(t *testing.T) {
	testdb.SkipOnCockroach(t, "relies on PostgreSQL finishing a statement whose client is gone")
	shortLease(t, time.Second) // the cut migrator cannot release its lease
	dsn := testdb.New(t)
	ctx := context.Background()
	app := func(files map[string]string) *Application {
		return &Application{Name: "firmware", Migrations: appFiles(files)}
	}
	if _, err := migrator(t, dsn, app(firmwareV1), plain).Up(ctx); err != nil {
		t.Fatal(err)
	}
	cut, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	if _, err := migrator(t, dsn, app(firmwareV2), plain).Up(cut); err == nil {
		t.Fatal("Up cut off during the slow migration succeeded")
	}
	// The server finishes the file after its client is gone.
	db := openRaw(t, dsn)
	for deadline := time.Now().Add(20 * time.Second); ; {
		var done bool
		if err := db.QueryRow(`SELECT count(*) > 0 FROM information_schema.columns
			WHERE table_schema = current_schema() AND table_name = 'firmware' AND column_name = 'blob_sha'`).Scan(&done); err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server did not finish the migration")
		}
		time.Sleep(50 * time.Millisecond)
	}

	m := migrator(t, dsn, app(firmwareV2), plain)
	_, err := m.Up(ctx)
	var verr *SchemaVersionError
	if !errors.As(err, &verr) || !errors.Is(err, ErrSchemaDirty) {
		t.Fatalf("Up of the dirty schema = %v, want ErrSchemaDirty", err)
	}
	t.Log(err)
	want := []SchemaObject{{"table", "firmware_blobs", true}, {"index", "firmware_blobs_size_idx", true}, {"column", "firmware.blob_sha", true}}
	if verr.Table != "firmware_schema_migrations" || verr.Database != 2 || verr.Previous != 1 || verr.File != "000002_firmware_blobs.up.sql" || verr.Rerunnable || !reflect.DeepEqual(verr.Objects, want) {
		t.Errorf("error %+v, want version 2 of firmware_schema_migrations, previous 1, objects %+v", verr, want)
	}
	for _, s := range []string{"table firmware_schema_migrations records version 2 as dirty", "000002_firmware_blobs.up.sql", "Everything it creates exists",
		"the schema matches version 2", "bmdbctl migrate force 2 --app firmware"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("the error lacks %q", s)
		}
	}
	if err := m.Check(ctx); !errors.Is(err, ErrSchemaDirty) || !strings.Contains(err.Error(), "Everything it creates exists") {
		t.Errorf("Check of the dirty schema = %v", err)
	}
	before, err := m.Force(ctx, "firmware", 2)
	if err != nil || before.Database != 2 || !before.Dirty {
		t.Fatalf("Force(firmware, 2) = %+v, %v; want it to have been 2, dirty", before, err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("Up after forcing the version the schema matches: %v", err)
	}
	if v := version(t, m, "firmware"); v.Database != 2 || v.Dirty || v.Err != nil {
		t.Errorf("firmware after the repair: %+v", v)
	}
}

// The dirty error tells the other cases apart: nothing of the file there
// (the schema matches the previous version), and a file that creates
// nothing to look for.
func TestDirtyErrorSaysWhichVersionMatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name, v2 string
		want     []string
	}{
		{"nothing there", "CREATE TABLE IF NOT EXISTS rack_rows (r INT8);\nCREATE INDEX rack_rows_idx ON rack_rows (r);",
			[]string{"Nothing it creates exists (table rack_rows, index rack_rows_idx)", "matches version 1", "bmdbctl migrate force 1 --app racks --migrations DIR"}},
		{"nothing to look for", "INSERT INTO bmdb_app_schema_compat (application, version, oldest_compatible) VALUES ('racks', 2, 1);",
			[]string{"creates no table, view, index, type, sequence or column", "matches version 2: run bmdbctl migrate force 2 --app racks;"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dsn := testdb.New(t)
			files := map[string]string{"000001_racks": "CREATE TABLE racks (id INT8);", "000002_more": tc.v2}
			m := migrator(t, dsn, &Application{Name: "racks", Migrations: appFiles(files)}, plain)
			migrator(t, dsn, &Application{Name: "racks", Migrations: appFiles(map[string]string{"000001_racks": files["000001_racks"]})}, plain).Up(ctx)
			if _, err := openRaw(t, dsn).Exec("UPDATE racks_schema_migrations SET version = 2, dirty = true"); err != nil {
				t.Fatal(err)
			}
			_, err := m.Up(ctx)
			if !errors.Is(err, ErrSchemaDirty) {
				t.Fatalf("Up = %v, want ErrSchemaDirty", err)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("the error lacks %q: %v", s, err)
				}
			}
		})
	}
}

// An application's file marked bmdb:rerunnable that did not finish is run
// again by Up, as bmdb's own are.
func TestUpRecoversRerunnableApplicationFile(t *testing.T) {
	t.Parallel()
	dsn := testdb.New(t)
	ctx := context.Background()
	files := map[string]string{
		"000001_racks": "CREATE TABLE racks (id INT8 PRIMARY KEY);",
		"000002_slots": "-- bmdb:rerunnable\nCREATE TABLE IF NOT EXISTS rack_slots (rack INT8 NOT NULL, slot INT8 NOT NULL, PRIMARY KEY (rack, slot));\n" +
			"INSERT INTO racks (id) VALUES (1) ON CONFLICT DO NOTHING;",
	}
	m := migrator(t, dsn, &Application{Name: "racks", Migrations: appFiles(files)}, plain)
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	// Half of 000002 undone, as if it had stopped after its first statement.
	if _, err := openRaw(t, dsn).Exec("DELETE FROM racks; UPDATE racks_schema_migrations SET dirty = true"); err != nil {
		t.Fatal(err)
	}
	if err := m.Check(ctx); !errors.Is(err, ErrSchemaDirty) || !strings.Contains(err.Error(), "Migrator.Up or bmdbctl migrate up runs it again") {
		t.Errorf("Check of the dirty, re-runnable schema = %v", err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("Up of a dirty, re-runnable application file: %v", err)
	}
	var n int
	openRaw(t, dsn).QueryRow("SELECT count(*) FROM racks").Scan(&n)
	if v := version(t, m, "racks"); v.Database != 2 || v.Dirty || n != 1 {
		t.Errorf("after recovery: %+v, %d racks; want 2, clean, the file run again", v, n)
	}
}

// A migrator that waits for the lease until its ctx ends says whom it
// waited for, since when.
func TestUpNamesLeaseHolder(t *testing.T) {
	t.Parallel()
	dsn := testdb.NewEmpty(t)
	ctx := context.Background()
	lock, err := acquireMigrationLock(ctx, openRaw(t, dsn), "slow-migrator (host h1, pid 17)")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.release()
	// Long enough to get to the wait for the lock on a loaded machine
	// (700 ms was not, beside three spinners): the holder never lets go.
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err = migrator(t, dsn, nil, plain).Up(short)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Up while another holds the lease = %v, want the deadline", err)
	}
	for _, s := range []string{`for the migration lock held by "slow-migrator (host h1, pid 17)"`, " since ", "renewed until "} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("the error lacks %q: %v", s, err)
		}
	}
}

// Versions lists bmdb's schema and every application's in the database,
// those the Migrator has no files of included; of those it knows only the
// recorded version, which Force accepts.
func TestVersionsListsEveryApplication(t *testing.T) {
	t.Parallel()
	dsn := testdb.New(t)
	ctx := context.Background()
	racks := &Application{Name: "racks", Migrations: appFiles(map[string]string{"000001_racks": "CREATE TABLE racks (id INT8);"})}
	burnin := &Application{Name: "burnin", Migrations: appFiles(map[string]string{"000001_b": "CREATE TABLE b (id INT8);", "000002_c": "CREATE TABLE c (id INT8);"})}
	for _, app := range []*Application{racks, burnin} {
		if _, err := migrator(t, dsn, app, plain).Up(ctx); err != nil {
			t.Fatal(err)
		}
	}
	m := migrator(t, dsn, racks, plain)
	versions, err := m.Versions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range versions {
		got = append(got, v.Schema+" "+v.Table+" "+itoa(v.Database)+" "+itoa(v.Binary))
		if v.Err != nil {
			t.Errorf("%s: Err %v", v.Schema, v.Err)
		}
	}
	latest := itoa(m.srcs[0].latest)
	want := []string{"bmdb schema_migrations " + latest + " " + latest, "burnin burnin_schema_migrations 2 0", "racks racks_schema_migrations 1 1"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Versions = %q, want %q", got, want)
	}

	openRaw(t, dsn).Exec("UPDATE burnin_schema_migrations SET dirty = true")
	v := version(t, m, "burnin")
	if !v.Dirty || !errors.Is(v.Err, ErrSchemaDirty) || !strings.Contains(v.Err.Error(), "does not have the schema's migration files") ||
		!strings.Contains(v.Err.Error(), "burnin_schema_migrations") {
		t.Errorf("a dirty application without files: %+v", v)
	}
	if _, err := m.Force(ctx, "burnin", 1); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "only the version its table burnin_schema_migrations records, 2, and 0") {
		t.Errorf("Force(burnin, 1) without its files = %v", err)
	}
	if before, err := m.Force(ctx, "burnin", 2); err != nil || !before.Dirty {
		t.Errorf("Force(burnin, 2) = %+v, %v", before, err)
	}
	if v := version(t, m, "burnin"); v.Dirty || v.Database != 2 {
		t.Errorf("burnin after Force: %+v", v)
	}
}

// createdObjects finds what a migration file creates, whatever the case,
// quoting, qualification and comments.
func TestCreatedObjects(t *testing.T) {
	t.Parallel()
	body := `-- CREATE TABLE commented_out (x INT8);
/* CREATE TABLE
   block_commented (x INT8); */
CREATE TABLE IF NOT EXISTS racks (id INT8 PRIMARY KEY);
create unlogged table "Odd Name" (x int8);
CREATE TABLE public.qualified (x INT8);
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS racks_id_idx ON racks (id);
CREATE INDEX ON racks (id);
CREATE OR REPLACE VIEW rack_view AS SELECT id FROM racks;
CREATE MATERIALIZED VIEW rack_mat AS SELECT id FROM racks;
CREATE TYPE rack_kind AS ENUM ('a', 'b');
CREATE SEQUENCE rack_seq;
ALTER TABLE racks ADD COLUMN row_name TEXT, ADD COLUMN IF NOT EXISTS "Slot" INT8, ADD CONSTRAINT c CHECK (id > 0);
ALTER TABLE IF EXISTS racks ADD height INT8;
ALTER TABLE racks ADD PRIMARY KEY (id);
INSERT INTO racks VALUES (1);
DROP TABLE IF EXISTS old_racks;
`
	want := []SchemaObject{
		{Kind: "table", Name: "racks"}, {Kind: "table", Name: `"Odd Name"`}, {Kind: "table", Name: "public.qualified"},
		{Kind: "index", Name: "racks_id_idx"}, {Kind: "view", Name: "rack_view"}, {Kind: "view", Name: "rack_mat"},
		{Kind: "type", Name: "rack_kind"}, {Kind: "sequence", Name: "rack_seq"},
		{Kind: "column", Name: "racks.row_name"}, {Kind: "column", Name: `racks."Slot"`}, {Kind: "column", Name: "racks.height"},
	}
	if got := createdObjects(body); !reflect.DeepEqual(got, want) {
		t.Errorf("createdObjects =\n%+v\nwant\n%+v", got, want)
	}
	if got := splitName(`Public."Odd Name".Col`); !reflect.DeepEqual(got, []string{"public", "Odd Name", "col"}) {
		t.Errorf("splitName = %q", got)
	}
}

// Every object bmdb's first migration creates is found on a database at
// version 1 (later migrations drop some: 000017, sessions_deadline_idx),
// by the statements that run on both engines.
func TestObjectsOfBmdbExist(t *testing.T) {
	t.Parallel()
	dsn := testdb.NewEmpty(t)
	migrateTo(t, migrator(t, dsn, nil, plain), 1)
	db := openRaw(t, dsn)
	src, err := bmdbSource()
	if err != nil {
		t.Fatal(err)
	}
	body, _, err := readUp(src, 1)
	if err != nil {
		t.Fatal(err)
	}
	objects := createdObjects(body)
	kinds := map[string]bool{}
	for _, o := range objects {
		ok, err := objectExists(context.Background(), db, o)
		if err != nil || !ok {
			t.Errorf("%s %s: exists %v, %v", o.Kind, o.Name, ok, err)
		}
		kinds[o.Kind] = true
	}
	if !kinds["table"] || !kinds["type"] || !kinds["index"] {
		t.Errorf("000001's objects %+v lack a table, a type or an index", objects)
	}
	for _, o := range []SchemaObject{{Kind: "table", Name: "nope"}, {Kind: "type", Name: "nope"}, {Kind: "column", Name: "machines.nope"}} {
		if ok, err := objectExists(context.Background(), db, o); err != nil || ok {
			t.Errorf("%s %s: exists %v, %v; want false", o.Kind, o.Name, ok, err)
		}
	}
}

// Force on the cockroachdb driver (cockroach mode), with and without the
// application's files, and a dirty version newer than the files.
func TestCockroachForce(t *testing.T) {
	t.Parallel()
	testdb.SkipOnCockroach(t, "cockroach mode is for PostgreSQL")
	dsn := testdb.New(t)
	ctx := context.Background()
	files := map[string]string{"000001_racks": "CREATE TABLE racks (id INT8);", "000002_slots": "CREATE TABLE slots (id INT8);"}
	app := &Application{Name: "racks", Migrations: appFiles(files)}
	m := migrator(t, dsn, app, cockroach(0))
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	openRaw(t, dsn).Exec("UPDATE racks_schema_migrations SET version = 3, dirty = true")
	if err := m.Check(ctx); !errors.Is(err, ErrSchemaDirty) || !strings.Contains(err.Error(), "files go up to version 2 and do not include it") {
		t.Errorf("Check of a dirty version newer than the files = %v", err)
	}
	if _, err := m.Force(ctx, "racks", 2); err != nil {
		t.Fatalf("Force with the files: %v", err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("Up after Force: %v", err)
	}
	openRaw(t, dsn).Exec("UPDATE racks_schema_migrations SET dirty = true")
	bare := migrator(t, dsn, nil, cockroach(0))
	if before, err := bare.Force(ctx, "racks", 2); err != nil || before.Database != 2 || !before.Dirty {
		t.Fatalf("Force without the files = %+v, %v", before, err)
	}
	if err := m.Check(ctx); err != nil {
		t.Errorf("Check after Force = %v", err)
	}
	if _, err := bare.Force(ctx, "racks", 0); err != nil {
		t.Fatalf("Force 0 without the files: %v", err)
	}
	if v := version(t, bare, "racks"); v.Database != 0 || v.Dirty {
		t.Errorf("after Force 0: %+v", v)
	}
}

// Up and Down say what they ran, in order: each file's schema, version,
// name and direction; nothing when the schema is where they would bring
// it; a dirty file run again.
func TestResultSaysWhatRan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, mode := range []crdbmode.Settings{plain, cockroach(0)} {
		dsn := testdb.NewEmpty(t)
		app := &Application{Name: "racks", Migrations: appFiles(map[string]string{
			"000001_racks": "CREATE TABLE IF NOT EXISTS racks (id INT8);",
			"000002_slots": "-- bmdb:rerunnable\nCREATE TABLE IF NOT EXISTS rack_slots (id INT8);",
		})}
		m := migrator(t, dsn, app, mode)
		latest := m.srcs[0].latest
		res, err := m.Up(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range res.Migrations {
			if r.Duration <= 0 {
				t.Errorf("%+v: no duration", r)
			}
			got = append(got, r.Schema+" "+itoa(r.Version)+" "+string(r.Direction)+" "+r.Name)
		}
		if len(got) != int(latest)+2 || got[0] != "bmdb 1 up 000001_init.up.sql" || got[14] != "bmdb 15 up 000015_fleet_controls.up.sql" ||
			got[latest] != "racks 1 up 000001_racks.up.sql" || got[latest+1] != "racks 2 up 000002_slots.up.sql" {
			t.Errorf("cockroach mode %v: Up of an empty database ran %q", mode.Enabled, got)
		}
		// Cockroach mode answers the step's check as in place: none on
		// either path here (the step itself: TestHistoryIDSpreadOnCockroachOnly).
		if len(res.CockroachSteps) != 0 {
			t.Errorf("cockroach mode %v: CockroachDB steps %q", mode.Enabled, res.CockroachSteps)
		}
		if res, err := m.Up(ctx); err != nil || len(res.Migrations) != 0 || len(res.CockroachSteps) != 0 {
			t.Errorf("Up of a current schema = %+v, %v; want nothing run", res, err)
		}
		res, err = m.Down(ctx, SchemaBmdb, 1)
		if err != nil || len(res.Migrations) != 1 || res.Migrations[0].Schema != SchemaBmdb || res.Migrations[0].Version != latest || res.Migrations[0].Direction != DirectionDown ||
			!strings.HasPrefix(res.Migrations[0].Name, fmt.Sprintf("%06d_", latest)) || !strings.HasSuffix(res.Migrations[0].Name, ".down.sql") {
			t.Errorf("Down 1 = %+v, %v; want the down file of %d", res, err, latest)
		}
		if _, err := openRaw(t, dsn).Exec("UPDATE racks_schema_migrations SET dirty = true"); err != nil {
			t.Fatal(err)
		}
		res, err = m.Up(ctx)
		if err != nil || len(res.Migrations) != 2 || res.Migrations[0].Version != latest || res.Migrations[1].Name != "000002_slots.up.sql" || res.Migrations[1].Direction != DirectionUp {
			t.Errorf("Up after Down and a dirty racks 2 = %+v, %v", res, err)
		}
	}
}

// A pool of two connections migrates, also with two migrators of one
// process at once, and on every CockroachDB path, within a deadline (no
// call waits for a connection it holds itself); a pool of one is refused
// at once, naming the limit: while the migration held its only
// connection, the lease could not be renewed, and would expire under a
// long migration. (Without the check, the short migrations here pass on
// one connection: the renewal, every lease/3, never comes due.)
func TestMigrateOnSmallPool(t *testing.T) {
	t.Parallel()
	for _, mode := range []crdbmode.Settings{plain, cockroach(0), {Enabled: true, Version: crdbmode.Version{Major: 23, Minor: 2}}} {
		dsn := testdb.NewEmpty(t)
		db := pool(t, dsn, mode)
		db.SetMaxOpenConns(1)
		m, err := New(db, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		start := time.Now()
		if _, err := m.Up(ctx); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "limited to 1 open connection") || time.Since(start) > 10*time.Second {
			t.Errorf("Up on a pool of one connection = %v after %v, want ErrInvalidArgument at once", err, time.Since(start))
		}
		if err := m.Check(ctx); !errors.Is(err, ErrSchemaTooOld) {
			t.Errorf("Check on a pool of one connection = %v, want ErrSchemaTooOld", err)
		}
		db.SetMaxOpenConns(2)
		errs := make(chan error, 2)
		for range 2 {
			go func() { _, err := m.Up(ctx); errs <- err }()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Errorf("cockroach mode %+v: Up on a pool of two connections: %v", mode, err)
			}
		}
		// A dirty version is recovered on two connections too.
		if _, err := db.ExecContext(ctx, "UPDATE schema_migrations SET dirty = true"); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Up(ctx); err != nil {
			t.Errorf("cockroach mode %+v: Up of a dirty version on a pool of two connections: %v", mode, err)
		}
		if _, err := m.Down(ctx, SchemaBmdb, 2); err != nil {
			t.Errorf("cockroach mode %+v: Down on a pool of two connections: %v", mode, err)
		}
		cancel()
		if v := version(t, m, SchemaBmdb); v.Dirty || v.Database != v.Binary-2 {
			t.Errorf("cockroach mode %+v: after Up and Down 2: %+v", mode, v)
		}
	}
}
