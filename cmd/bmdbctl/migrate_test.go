package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
	"github.com/bmdb-dev/bmdb/migrations"
)

// bmdbLatest is the newest version of bmdb's migrations.
func bmdbLatest(t *testing.T, dsn string) uint {
	t.Helper()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m, err := migrations.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	versions, err := m.Versions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return versions[0].Binary
}

// execSQL runs statements on dsn.
func execSQL(t *testing.T, dsn, statements string) {
	t.Helper()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(statements); err != nil {
		t.Fatal(err)
	}
}

// racksFiles are an application's migrations, as files and as a
// directory (its repository's) for --migrations.
var racksFiles = map[string]string{
	"000001_racks.up.sql":   "CREATE TABLE racks (id INT8 PRIMARY KEY);",
	"000001_racks.down.sql": "DROP TABLE racks;",
	"000002_slots.up.sql":   "CREATE TABLE rack_slots (rack INT8 NOT NULL, slot INT8 NOT NULL);\nCREATE INDEX rack_slots_idx ON rack_slots (rack);",
	"000002_slots.down.sql": "DROP TABLE rack_slots;",
}

// writeFiles writes files into a new directory and returns it.
func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// openWith opens dsn as the application with files, migrating it.
func openWith(t *testing.T, dsn, name string, files map[string]string) {
	t.Helper()
	fsys := fstest.MapFS{}
	for n, body := range files {
		fsys[n] = &fstest.MapFile{Data: []byte(body)}
	}
	conn, err := bmdb.Open(context.Background(), bmdb.Config{DSN: dsn, ComponentName: name, Application: &migrations.Application{Name: name, Migrations: fsys}})
	if err != nil {
		t.Fatalf("Open as %s: %v", name, err)
	}
	conn.Close()
}

// The case: an application's migration left dirty although the
// server finished it (its client was cut off). migrate version and up
// exit 1 and say which table and what to do; with the application's files
// bmdbctl lists what the file created and finds it there; migrate force
// knows only the versions it can (exit 2 for another), records the one
// the schema matches, and migrate up then succeeds.
func TestMigrateForceDirtyApplication(t *testing.T) {
	t.Parallel()
	dsn := testdb.New(t)
	openWith(t, dsn, "racks", racksFiles)
	execSQL(t, dsn, "UPDATE racks_schema_migrations SET dirty = true")
	dir := writeFiles(t, racksFiles)

	for _, args := range [][]string{{"migrate", "version"}, {"migrate", "up"}} {
		out, errOut, code := ctl(t, dsn, args...)
		if code != 1 || !regexp.MustCompile(`(?m)^racks +racks_schema_migrations +2 +- +true *$`).MatchString(out) {
			t.Errorf("bmdbctl %q on a dirty application schema: exit %d, stdout:\n%s", args, code, out)
		}
		for _, want := range []string{"table racks_schema_migrations records version 2 as dirty", "bmdbctl migrate force 2 --app racks", "--migrations DIR"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("bmdbctl %q: stderr lacks %q: %s", args, want, errOut)
			}
		}
	}
	_, errOut, code := ctl(t, dsn, "migrate", "version", "--app", "racks", "--migrations", dir)
	if code != 1 || !strings.Contains(errOut, "Everything it creates exists (table rack_slots, index rack_slots_idx): the schema matches version 2") {
		t.Errorf("migrate version with the application's files: exit %d, %s", code, errOut)
	}
	t.Logf("migrate version --app racks --migrations DIR:\n%s", errOut)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "force", "1", "--app", "racks"}, "only the version its table racks_schema_migrations records, 2, and 0"},
		{[]string{"migrate", "force", "7", "--app", "racks", "--migrations", dir}, "version 7 is not one of the migrations of application racks: want 0 (none applied) or one of 1-2"},
		{[]string{"migrate", "force", "1", "--app", "nope"}, `application "nope" has no version table nope_schema_migrations`},
	} {
		if out, errOut, code := ctl(t, dsn, tc.args...); code != 2 || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("bmdbctl %q: exit %d, stdout %q, stderr %q; want exit 2 with %q", tc.args, code, out, errOut, tc.want)
		}
	}
	out := ok(t, dsn, "migrate", "force", "2", "--app", "racks")
	if !strings.Contains(out, "forced application racks (table racks_schema_migrations) from version 2 (dirty) to version 2 (clean)") {
		t.Errorf("migrate force 2:\n%s", out)
	}
	var forced []struct {
		Schema, Table        string
		FromVersion, Version uint
		FromDirty            bool
	}
	if err := json.Unmarshal([]byte(ok(t, dsn, "migrate", "force", "2", "--app", "racks", "--json")), &forced); err != nil || len(forced) != 1 ||
		forced[0].Schema != "racks" || forced[0].FromDirty || forced[0].Version != 2 {
		t.Errorf("migrate force --json = %+v, %v", forced, err)
	}
	if out := ok(t, dsn, "migrate", "up"); !regexp.MustCompile(`(?m)^racks +racks_schema_migrations +2 +- +false *$`).MatchString(out) {
		t.Errorf("migrate up after force:\n%s", out)
	}
	openWith(t, dsn, "racks", racksFiles)
	if out := ok(t, dsn, "migrate", "lock"); !strings.Contains(out, "(none)") {
		t.Errorf("the lease after force:\n%s", out)
	}
}

// bmdb's own schema dirty (at 000001, whose file is re-runnable like all
// of bmdb's): version and sessions exit 1 naming schema_migrations and
// saying that up runs the file again; force records the version as clean;
// and up recovers a dirty version by itself.
func TestMigrateForceDirtyBmdb(t *testing.T) {
	t.Parallel()
	dsn := testdb.NewEmpty(t)
	if out := ok(t, dsn, "migrate", "up"); !regexp.MustCompile(`(?m)^ran 000001_init.up.sql \(bmdb's schema\) in \d`).MatchString(out) ||
		!strings.Contains(out, "ran 000015_fleet_controls.up.sql (bmdb's schema)") {
		t.Errorf("migrate up of an empty database does not say what it ran:\n%s", out)
	}
	latest := bmdbLatest(t, dsn)
	if out := ok(t, dsn, "migrate", "down", "--steps", strconv.Itoa(int(latest-1))); !strings.Contains(out, "ran 000002_example_tags.down.sql (bmdb's schema)") || strings.Contains(out, "000001_init") {
		t.Errorf("migrate down to 1 does not say what it ran:\n%s", out)
	}
	execSQL(t, dsn, "UPDATE schema_migrations SET dirty = true")
	for _, args := range [][]string{{"migrate", "version"}, {"sessions"}} {
		out, errOut, code := ctl(t, dsn, args...)
		if code != 1 {
			t.Errorf("bmdbctl %q on a dirty schema: exit %d, stdout:\n%s", args, code, out)
		}
		for _, want := range []string{"table schema_migrations records version 1 as dirty", "000001_init.up.sql", "bmdbctl migrate up runs it again"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("bmdbctl %q: stderr lacks %q: %s", args, want, errOut)
			}
		}
	}
	if out := ok(t, dsn, "migrate", "force", "1"); !strings.Contains(out, "forced bmdb's schema (table schema_migrations) from version 1 (dirty) to version 1 (clean)") {
		t.Errorf("migrate force 1:\n%s", out)
	}
	execSQL(t, dsn, "UPDATE schema_migrations SET dirty = true")
	if out := ok(t, dsn, "migrate", "up"); !regexp.MustCompile(`(?m)^bmdb +schema_migrations +` + strconv.Itoa(int(latest)) + ` +\d+ +false *$`).MatchString(out) {
		t.Errorf("migrate up of a dirty schema:\n%s", out)
	}
}

// With --app and --migrations, bmdbctl migrates an application's schema
// too: up applies its files after bmdb's and runs again one marked
// bmdb:rerunnable that did not finish, as Open does; down reverts them.
func TestMigrateApplicationFiles(t *testing.T) {
	t.Parallel()
	dsn := testdb.New(t)
	files := map[string]string{
		"000001_racks.up.sql":   "CREATE TABLE racks (id INT8 PRIMARY KEY);",
		"000001_racks.down.sql": "DROP TABLE racks;",
		"000002_slots.up.sql": "-- bmdb:rerunnable\nCREATE TABLE IF NOT EXISTS rack_slots (rack INT8 NOT NULL);\n" +
			"INSERT INTO racks (id) VALUES (1) ON CONFLICT DO NOTHING;",
		"000002_slots.down.sql": "DROP TABLE rack_slots; DELETE FROM racks;",
	}
	dir := writeFiles(t, files)
	app := []string{"--app", "racks", "--migrations", dir}
	if out := ok(t, dsn, append([]string{"migrate", "up"}, app...)...); !regexp.MustCompile(`(?m)^racks +racks_schema_migrations +2 +2 +false *$`).MatchString(out) {
		t.Errorf("migrate up with the application's files:\n%s", out)
	}
	// 000002 stopped after its first statement.
	execSQL(t, dsn, "DELETE FROM racks; UPDATE racks_schema_migrations SET dirty = true")
	if out := ok(t, dsn, append([]string{"migrate", "up"}, app...)...); !regexp.MustCompile(`(?m)^racks +racks_schema_migrations +2 +2 +false *$`).MatchString(out) {
		t.Errorf("migrate up of a dirty, re-runnable application file:\n%s", out)
	}
	var n int
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.QueryRow("SELECT count(*) FROM racks").Scan(&n); err != nil || n != 1 {
		t.Errorf("%d racks after recovery (%v): the file did not run again", n, err)
	}
	if out := ok(t, dsn, append([]string{"migrate", "down", "--steps", "1"}, app...)...); !regexp.MustCompile(`(?m)^racks +racks_schema_migrations +1 +2 +false *$`).MatchString(out) {
		t.Errorf("migrate down --app racks:\n%s", out)
	}
	if _, errOut, code := ctl(t, dsn, append([]string{"migrate", "down", "--steps", "5"}, app...)...); code != 2 || !strings.Contains(errOut, "--steps is 5, but application racks (table racks_schema_migrations) has 1 migrations applied") {
		t.Errorf("migrate down --steps 5 --app racks: exit %d, %s", code, errOut)
	}
}
