package migrations

import (
	"context"
	"testing"
	"testing/fstest"

	gomigrate "github.com/golang-migrate/migrate/v4"

	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// migrator returns a Migrator of dsn with app (nil: none) in the cockroach
// mode mode, whatever the process's.
func migrator(t *testing.T, dsn string, app *Application, mode crdbmode.Settings) *Migrator {
	t.Helper()
	cfg := &Config{Application: app, HolderInfo: t.Name()}
	if mode.Enabled {
		cfg.WrapConnector = testdb.EmulatorWith(mode).Wrap
	}
	m, err := New(dsn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// cockroach is cockroach mode failing the next multi-statement migration
// file after failAfter statements (0: never).
func cockroach(failAfter int) crdbmode.Settings {
	return crdbmode.Settings{Enabled: true, MigrationFailAfter: failAfter}
}

// migrateTo migrates m's bmdb schema up or down to version, holding the
// lease, as tests build old schemas.
func migrateTo(t *testing.T, m *Migrator, version uint) {
	t.Helper()
	ctx := context.Background()
	err := m.withPool(ctx, func(mp *migrationPool) error {
		return mp.locked(ctx, "migrateTo", func() error {
			_, err := mp.run(ctx, m.srcs[0], func(g *gomigrate.Migrate) error { return g.Migrate(version) })
			return err
		})
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
