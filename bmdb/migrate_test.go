package bmdb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
	"github.com/bmdb-dev/bmdb/migrations"
)

// openRaw opens a plain pool on dsn, closed at cleanup.
func openRaw(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func tables(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	err := db.QueryRow(`SELECT count(*) FROM information_schema.tables
		WHERE table_schema = current_schema() AND table_name IN ('machines', 'sessions', 'work', 'work_history', 'work_backoff')`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// migrator returns a Migrator of the database at dsn in cockroach mode s,
// on a pool of its own, closed at cleanup.
func migrator(t *testing.T, dsn string, s crdbmode.Settings) *migrations.Migrator {
	t.Helper()
	var wrap func(driver.Connector) driver.Connector
	if s.Enabled {
		wrap = testdb.EmulatorWith(s).Wrap
	}
	connector, err := newConnector(dsn, 10*time.Second, connSettings{}, wrap)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(connector)
	t.Cleanup(func() { db.Close() })
	m, err := migrations.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// schemaVersion returns the version of schema in the database at dsn.
func schemaVersion(t *testing.T, dsn, schema string) migrations.SchemaVersion {
	t.Helper()
	versions, err := migrator(t, dsn, crdbmode.Settings{}).Versions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range versions {
		if v.Schema == schema {
			return v
		}
	}
	return migrations.SchemaVersion{Schema: schema}
}

// migrateBmdbTo brings bmdb's schema of the empty database at dsn to
// version (as a binary of that version left it): up, then down.
func migrateBmdbTo(t *testing.T, dsn string, version uint) {
	t.Helper()
	ctx := context.Background()
	m := migrator(t, dsn, crdbmode.Settings{})
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	latest := schemaVersion(t, dsn, migrations.SchemaBmdb).Binary
	if _, err := m.Down(ctx, migrations.SchemaBmdb, int(latest-version)); err != nil {
		t.Fatal(err)
	}
}

func TestOpenMigratesEmptyDatabase(t *testing.T) {
	t.Parallel()
	dsn := testdb.NewEmpty(t)
	c, err := Open(context.Background(), Config{DSN: dsn, ComponentName: "test"})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	c.Close()
	if n := tables(t, openRaw(t, dsn)); n != 5 {
		t.Fatalf("%d tables after Open, want 5", n)
	}
}

// A schema newer than the binary, a dirty one, and (with migrations off) an
// old one are refused with a *SchemaVersionError naming the versions.
func TestOpenRefusesIncompatibleSchema(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup string // run against a fully migrated database
		skip  bool
		want  error
	}{
		{"too new", "UPDATE schema_migrations SET version = 999", false, migrations.ErrSchemaTooNew},
		{"too new, migrations off", "UPDATE schema_migrations SET version = 999", true, migrations.ErrSchemaTooNew},
		{"dirty, migrations off", "UPDATE schema_migrations SET dirty = true", true, migrations.ErrSchemaDirty},
		{"too old, migrations off", "DELETE FROM schema_migrations", true, migrations.ErrSchemaTooOld},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dsn := testdb.New(t)
			if _, err := openRaw(t, dsn).Exec(tc.setup); err != nil {
				t.Fatal(err)
			}
			_, err := Open(context.Background(), Config{DSN: dsn, ComponentName: "test", SkipMigrations: tc.skip})
			var verr *migrations.SchemaVersionError
			if !errors.Is(err, tc.want) || !errors.As(err, &verr) {
				t.Fatalf("Open = %v, want %v", err, tc.want)
			}
			if verr.Binary == 0 {
				t.Errorf("error does not name the binary's version: %v", err)
			}
			if verr.Table != "schema_migrations" || (verr.Dirty && !strings.Contains(err.Error(), "table schema_migrations records version")) {
				t.Errorf("error does not name the version table: %v", err)
			}
			t.Log(err)
		})
	}
}

// A dirty version whose file is safe to re-run (bmdb:rerunnable) is
// forced back and migrated again by Open. (Before, Open refused it.)
func TestOpenRecoversDirtyRerunnableVersion(t *testing.T) {
	t.Parallel()
	dsn := testdb.New(t)
	openRaw(t, dsn).Exec("UPDATE schema_migrations SET dirty = true")
	c, err := Open(context.Background(), Config{DSN: dsn, ComponentName: "test"})
	if err != nil {
		t.Fatalf("Open of a dirty, re-runnable version: %v", err)
	}
	c.Close()
	if v := schemaVersion(t, dsn, migrations.SchemaBmdb); v.Dirty || v.Database != v.Binary {
		t.Fatalf("schema after Open = %+v", v)
	}
}

// With migrations off, a current schema opens.
func TestOpenSkipMigrationsOnCurrentSchema(t *testing.T) {
	t.Parallel()
	c, err := Open(context.Background(), Config{DSN: testdb.New(t), ComponentName: "test", SkipMigrations: true})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	c.Close()
}

// Many components migrating one empty database at once all succeed.
func TestOpenMigratesConcurrently(t *testing.T) {
	t.Parallel()
	dsn := testdb.NewEmpty(t)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			c, err := Open(context.Background(), Config{DSN: dsn, ComponentName: "test"})
			if err == nil {
				c.Close()
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Open: %v", err)
		}
	}
}

// Rolling upgrade: a binary opens a schema newer than it knows when every
// newer migration declares it compatible, and refuses it otherwise.
func TestOpenNewerSchemaByCompatibility(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		newest int // versions past the binary's
		ok     bool
	}{
		{"additive migration", 1, true},
		{"two additive migrations", 2, true},
		{"breaking migration", 1, false},
		{"undeclared migration", 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dsn := testdb.New(t)
			db := openRaw(t, dsn)
			latest := int(schemaVersion(t, dsn, migrations.SchemaBmdb).Binary)
			var err error
			v := latest + tc.newest
			switch tc.name {
			case "additive migration":
				_, err = db.Exec("INSERT INTO bmdb_schema_compat VALUES ($1, 1)", latest+1)
			case "two additive migrations":
				_, err = db.Exec("INSERT INTO bmdb_schema_compat VALUES ($1, 1), ($2, 2)", latest+1, latest+2)
			case "breaking migration":
				_, err = db.Exec("INSERT INTO bmdb_schema_compat VALUES ($1, $1)", latest+1)
			case "undeclared migration":
				_, err = db.Exec("INSERT INTO bmdb_schema_compat VALUES ($1, 1)", latest+1)
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec("UPDATE schema_migrations SET version = $1", v); err != nil {
				t.Fatal(err)
			}
			for _, skip := range []bool{false, true} {
				c, err := Open(context.Background(), Config{DSN: dsn, ComponentName: "old-binary", SkipMigrations: skip})
				if tc.ok {
					if err != nil {
						t.Fatalf("Open (SkipMigrations %v) = %v, want it to accept a compatible newer schema", skip, err)
					}
					c.Close()
					continue
				}
				var verr *migrations.SchemaVersionError
				if !errors.Is(err, migrations.ErrSchemaTooNew) || !errors.As(err, &verr) || verr.Reason == "" {
					t.Fatalf("Open (SkipMigrations %v) = %v, want ErrSchemaTooNew with a reason", skip, err)
				}
				t.Log(err)
			}
			if got := schemaVersion(t, dsn, migrations.SchemaBmdb); int(got.Database) != v {
				t.Errorf("Open changed the schema version to %d", got.Database)
			}
		})
	}
}

// Open recovers a bmdb migration that CockroachDB applied in part
// (emulated in cockroach mode: 000012 stops after two of its three
// statements, the version stays dirty): the next Open runs the file again.
func TestCockroachOpenRecoversHalfAppliedMigration(t *testing.T) {
	t.Parallel()
	testdb.SkipOnCockroach(t, "emulates a failure between two statements")
	dsn := testdb.NewEmpty(t)
	ctx := context.Background()
	migrateBmdbTo(t, dsn, 11)
	open := func(failAfter int) error {
		cfg := Config{DSN: dsn, ComponentName: "rollout"}
		withMode(crdbmode.Settings{Enabled: true, MigrationFailAfter: failAfter})(&cfg)
		c, err := Open(ctx, cfg)
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := open(2); err == nil {
		t.Fatal("Open with a migration failing half-way succeeded")
	}
	if v := schemaVersion(t, dsn, migrations.SchemaBmdb); !v.Dirty || v.Database != 12 {
		t.Fatalf("schema after the failure = %+v; want 12, dirty", v)
	}
	if err := open(0); err != nil {
		t.Fatalf("Open after a half-applied migration: %v", err)
	}
	if v := schemaVersion(t, dsn, migrations.SchemaBmdb); v.Dirty || v.Database != v.Binary {
		t.Fatalf("schema after recovery = %+v", v)
	}
}

// cockroachModes are CockroachDB as each supported version runs a
// migration (crdbmode's ddl.go): 23.2 and 24.x run a script of several
// statements as one transaction, and so does 25.x with the role's
// autocommit_before_ddl off; 25.x by default commits each statement.
func cockroachModes() []struct {
	name string
	s    crdbmode.Settings
} {
	off := false
	return []struct {
		name string
		s    crdbmode.Settings
	}{
		{"23.2", crdbmode.Settings{Enabled: true, Version: crdbmode.Version{Major: 23, Minor: 2}}},
		{"24.1", crdbmode.Settings{Enabled: true, Version: crdbmode.Version{Major: 24, Minor: 1}}},
		{"24.3", crdbmode.Settings{Enabled: true, Version: crdbmode.Version{Major: 24, Minor: 3}}},
		{"25.2, autocommit_before_ddl off", crdbmode.Settings{Enabled: true, AutocommitBeforeDDL: &off}},
		{"25.2", crdbmode.Settings{Enabled: true}},
	}
}

// Open brings a database to the newest version on every CockroachDB
// version: one at 000014, a fresh one, and
// one reverted to 000013 (000015's and 000014's down files run too): bmdb
// sends each statement of a migration on its own. (Before, a whole file
// went in one Exec, one transaction on 23.2/24.x and on 25.x with
// autocommit_before_ddl off: 000015's partial index on the column it adds
// was refused, 0A000, and so was 000014 dropping and adding back a
// constraint of one name, 42710; the version stayed dirty, and running
// the file again failed the same way.)
func TestOpenMigratesOnEveryCockroachVersion(t *testing.T) {
	t.Parallel()
	testdb.SkipOnCockroach(t, "emulates each version")
	for _, mode := range cockroachModes() {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			open := func(dsn string) error {
				cfg := Config{DSN: dsn, ComponentName: "migrator"}
				withMode(mode.s)(&cfg)
				c, err := Open(ctx, cfg)
				if err != nil {
					return err
				}
				c.Close()
				if v := schemaVersion(t, dsn, migrations.SchemaBmdb); v.Dirty || v.Database != v.Binary {
					return fmt.Errorf("schema after Open = %+v", v)
				}
				return nil
			}
			at14 := testdb.NewEmpty(t)
			migrateBmdbTo(t, at14, 14)
			if err := open(at14); err != nil {
				t.Errorf("000015 on a database at 14: %v", err)
			}
			dsn := testdb.NewEmpty(t)
			if err := open(dsn); err != nil {
				t.Fatalf("a fresh database: %v", err)
			}
			downTo(t, dsn, mode.s, 13)
			if v := schemaVersion(t, dsn, migrations.SchemaBmdb); v.Dirty || v.Database != 13 || !relationExists(t, dsn, "claim_gate") || relationExists(t, dsn, "work_slot_idx") {
				t.Fatalf("after reverting to 13: %+v, claim_gate %v, work_slot_idx %v", v, relationExists(t, dsn, "claim_gate"), relationExists(t, dsn, "work_slot_idx"))
			}
			if err := open(dsn); err != nil {
				t.Fatalf("from version 13: %v", err)
			}
			if !relationExists(t, dsn, "work_slot_idx") || relationExists(t, dsn, "claim_gate") {
				t.Errorf("after migrating up again: work_slot_idx %v, claim_gate %v", relationExists(t, dsn, "work_slot_idx"), relationExists(t, dsn, "claim_gate"))
			}
		})
	}
}

// relationExists reports whether the relation name exists in dsn's database.
func relationExists(t *testing.T, dsn, name string) bool {
	t.Helper()
	var ok bool
	if err := openRaw(t, dsn).QueryRow("SELECT to_regclass($1) IS NOT NULL", name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// downTo reverts bmdb's schema at dsn to version in cockroach mode s.
func downTo(t *testing.T, dsn string, s crdbmode.Settings, version uint) {
	t.Helper()
	latest := schemaVersion(t, dsn, migrations.SchemaBmdb).Database
	if _, err := migrator(t, dsn, s).Down(context.Background(), migrations.SchemaBmdb, int(latest-version)); err != nil {
		t.Fatalf("reverting to %d: %v", version, err)
	}
}

// Config.MaxOpenConns 2 is enough for Open to migrate, on PostgreSQL's and
// CockroachDB's paths, within a deadline; 1 is refused at once with
// ErrInvalidArgument when there is something to migrate (the migration
// lease could not be renewed while the migration held the only
// connection), and is fine for a current schema.
func TestOpenMigratesOnSmallPool(t *testing.T) {
	t.Parallel()
	for _, mode := range []crdbmode.Settings{{}, {Enabled: true, Version: crdbmode.Version{Major: 23, Minor: 2}}} {
		dsn := testdb.NewEmpty(t)
		open := func(maxConns int) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := Config{DSN: dsn, ComponentName: "small", MaxOpenConns: maxConns}
			withMode(mode)(&cfg)
			c, err := Open(ctx, cfg)
			if err == nil {
				c.Close()
			}
			return err
		}
		start := time.Now()
		if err := open(1); !errors.Is(err, ErrInvalidArgument) || !errors.Is(err, migrations.ErrInvalidArgument) || !strings.Contains(err.Error(), "limited to 1 open connection") {
			t.Errorf("cockroach mode %v: Open with MaxOpenConns 1 on an empty database = %v after %v, want ErrInvalidArgument", mode.Enabled, err, time.Since(start))
		}
		if err := open(2); err != nil {
			t.Errorf("cockroach mode %v: Open with MaxOpenConns 2 on an empty database: %v", mode.Enabled, err)
		}
		if err := open(1); err != nil {
			t.Errorf("cockroach mode %v: Open with MaxOpenConns 1 on a current schema: %v", mode.Enabled, err)
		}
	}
}
