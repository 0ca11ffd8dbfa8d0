package migrations

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"testing"
	"testing/fstest"
	"time"

	gomigrate "github.com/golang-migrate/migrate/v4"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// migrator returns a Migrator of dsn with app (nil: none) in the cockroach
// mode mode, whatever the process's, on a pool of its own.
func migrator(t *testing.T, dsn string, app *Application, mode crdbmode.Settings) *Migrator {
	t.Helper()
	m, err := New(pool(t, dsn, mode), &Config{Application: app, HolderInfo: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// pool opens a pool on dsn as bmdb does (bounded by its callers'
// contexts), in cockroach mode mode, closed at cleanup.
func pool(t *testing.T, dsn string, mode crdbmode.Settings) *sql.DB {
	t.Helper()
	var wrap func(driver.Connector) driver.Connector
	if mode.Enabled {
		wrap = testdb.EmulatorWith(mode).Wrap
	}
	connector, err := dbconn.NewConnector(dsn, 10*time.Second, dbconn.Settings{}, wrap)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(connector)
	t.Cleanup(func() { db.Close() })
	return db
}

// cockroach is cockroach mode failing the next migration after failAfter
// of its statements (0: never).
func cockroach(failAfter int) crdbmode.Settings {
	return crdbmode.Settings{Enabled: true, MigrationFailAfter: failAfter}
}

// migrateTo migrates m's bmdb schema up or down to version, holding the
// lease, as tests build old schemas.
func migrateTo(t *testing.T, m *Migrator, version uint) {
	t.Helper()
	ctx := context.Background()
	tg, err := m.target(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = tg.locked(ctx, "migrateTo", func() error {
		_, err := tg.run(ctx, m.srcs[0], func(g *gomigrate.Migrate) error { return g.Migrate(version) })
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
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

// appFiles returns an application's migrations: ups maps file names
// (without .up.sql) to their up statements; each down file drops nothing.
func appFiles(ups map[string]string) fstest.MapFS {
	files := fstest.MapFS{}
	for name, up := range ups {
		files[name+".up.sql"] = &fstest.MapFile{Data: []byte(up)}
		files[name+".down.sql"] = &fstest.MapFile{Data: []byte("SELECT 1;")}
	}
	return files
}

// version returns what schema's version table records, by Versions.
func version(t *testing.T, m *Migrator, schema string) SchemaVersion {
	t.Helper()
	versions, err := m.Versions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range versions {
		if v.Schema == schema {
			return v
		}
	}
	t.Fatalf("no schema %q in %+v", schema, versions)
	return SchemaVersion{}
}
