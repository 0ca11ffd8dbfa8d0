package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	"github.com/golang-migrate/migrate/v4/database/cockroachdb"
	"github.com/golang-migrate/migrate/v4/database/postgres"
	"github.com/golang-migrate/migrate/v4/source"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/migrations"
	"github.com/bmdb-dev/bmdb/model"
)

// migrator wraps golang-migrate over the embedded migrations and one
// connection of the pool. Close releases the connection.
type migrator struct {
	m      *migrate.Migrate
	latest uint // newest version embedded in this binary
}

// newMigrator prepares migrations for the database of db and dsn. On
// PostgreSQL it uses golang-migrate's postgres driver over one connection of
// db; on CockroachDB its cockroachdb driver over a pool of its own, which
// that driver closes (each driver fails on the other engine).
func newMigrator(ctx context.Context, db *sql.DB, dsn string, eng engine) (*migrator, error) {
	src, err := iofs.New(migrations.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("bmdb: reading embedded migrations: %w", err)
	}
	latest, err := latestVersion(src)
	if err != nil {
		return nil, err
	}
	var drv database.Driver
	switch eng {
	case engineCockroach:
		var own *sql.DB
		own, err = openDB(ctx, dsn)
		if err == nil {
			drv, err = cockroachdb.WithInstance(own, &cockroachdb.Config{})
			if err != nil {
				own.Close()
			}
		}
	default:
		var conn *sql.Conn
		conn, err = db.Conn(ctx)
		if err == nil {
			drv, err = postgres.WithConnection(ctx, conn, &postgres.Config{})
			if err != nil {
				conn.Close()
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bmdb: preparing migrations: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, eng.String(), drv)
	if err != nil {
		drv.Close()
		return nil, fmt.Errorf("bmdb: preparing migrations: %w", err)
	}
	m.Log = migrateLogger{}
	return &migrator{m: m, latest: latest}, nil
}

// latestVersion returns the newest migration version in src.
func latestVersion(src source.Driver) (uint, error) {
	v, err := src.First()
	if err != nil {
		return 0, fmt.Errorf("bmdb: reading embedded migrations: %w", err)
	}
	for {
		next, err := src.Next(v)
		if errors.Is(err, os.ErrNotExist) {
			return v, nil
		}
		if err != nil {
			return 0, fmt.Errorf("bmdb: reading embedded migrations: %w", err)
		}
		v = next
	}
}

// version returns the database's schema version (0 when none) and whether
// it is dirty.
func (mg *migrator) version() (uint, bool, error) {
	v, dirty, err := mg.m.Version()
	if errors.Is(err, migrate.ErrNilVersion) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("bmdb: reading schema version: %w", err)
	}
	return v, dirty, nil
}

// check returns a *SchemaVersionError if the schema is dirty, newer than
// this binary, or older than it.
func (mg *migrator) check() error {
	v, dirty, err := mg.version()
	if err != nil {
		return err
	}
	verr := &SchemaVersionError{Database: v, Binary: mg.latest, Dirty: dirty}
	switch {
	case dirty:
		verr.Err = ErrSchemaDirty
	case v > mg.latest:
		verr.Err = ErrSchemaTooNew
	case v < mg.latest:
		verr.Err = ErrSchemaTooOld
	default:
		return nil
	}
	return verr
}

// up applies every migration newer than the schema. The dirty flag is
// checked by golang-migrate under its lock: read before it, it may only mean
// that another component is migrating right now.
func (mg *migrator) up() error {
	v, _, err := mg.version()
	if err != nil {
		return err
	}
	if v > mg.latest {
		return &SchemaVersionError{Err: ErrSchemaTooNew, Database: v, Binary: mg.latest}
	}
	err = mg.m.Up()
	var dirty migrate.ErrDirty
	switch {
	case err == nil, errors.Is(err, migrate.ErrNoChange):
		return nil
	case errors.As(err, &dirty):
		return &SchemaVersionError{Err: ErrSchemaDirty, Database: uint(dirty.Version), Binary: mg.latest, Dirty: true}
	}
	return fmt.Errorf("bmdb: migrating up: %w", err)
}

// down reverts every migration: all bmdb data is lost.
func (mg *migrator) down() error {
	if err := mg.m.Down(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("bmdb: migrating down: %w", err)
	}
	return nil
}

func (mg *migrator) close() {
	srcErr, dbErr := mg.m.Close()
	if err := errors.Join(srcErr, dbErr); err != nil {
		klog.Warningf("bmdb: closing migrator: %v", err)
	}
}

// migrateOnOpen migrates the schema up (apply) or checks that it is current.
// A schema newer than the binary is accepted if every newer migration
// declared, in bmdb_schema_compat, that this binary's version still works
// with it (a rolling upgrade); otherwise it is refused.
func migrateOnOpen(ctx context.Context, db *sql.DB, dsn string, eng engine, apply bool) error {
	mg, err := newMigrator(ctx, db, dsn, eng)
	if err != nil {
		return err
	}
	defer mg.close()
	v, dirty, err := mg.version()
	if err != nil {
		return err
	}
	if !dirty && v > mg.latest {
		return checkNewerSchema(ctx, db, v, mg.latest)
	}
	if apply {
		return mg.up()
	}
	return mg.check()
}

// checkNewerSchema accepts a database at version v > latest if each
// migration in (latest, v] declared latest's binaries compatible.
func checkNewerSchema(ctx context.Context, db *sql.DB, v, latest uint) error {
	tooNew := &SchemaVersionError{Err: ErrSchemaTooNew, Database: v, Binary: latest}
	row, err := model.New(db).SchemaCompatOldest(ctx, model.SchemaCompatOldestParams{
		KnownVersion: int64(latest), DatabaseVersion: int64(v),
	})
	switch {
	case err != nil && sqlState(err) == "42P01": // no bmdb_schema_compat: nothing declared
		tooNew.Reason = "the database records no compatibility (no bmdb_schema_compat)"
		return tooNew
	case err != nil:
		return fmt.Errorf("bmdb: reading bmdb_schema_compat: %w", err)
	case row.Declared != int64(v-latest):
		tooNew.Reason = fmt.Sprintf("only %d of the %d newer migrations declare their compatibility", row.Declared, v-latest)
		return tooNew
	case row.OldestCompatible > int64(latest):
		tooNew.Reason = fmt.Sprintf("a newer migration needs binaries of version %d or later", row.OldestCompatible)
		return tooNew
	}
	klog.Infof("bmdb: database schema at version %d, newer than this binary's %d; the newer migrations keep version %d working", v, latest, latest)
	return nil
}

// migrateLogger sends golang-migrate's log to klog.
type migrateLogger struct{}

func (migrateLogger) Printf(format string, v ...any) { klog.V(2).Infof("migrate: "+format, v...) }
func (migrateLogger) Verbose() bool                  { return klog.V(2).Enabled() }

// SchemaInfo describes a database's schema version against this binary's.
type SchemaInfo struct {
	Database uint // the version recorded in the database (0: none)
	Binary   uint // the newest version embedded in this binary
	Dirty    bool // a migration failed half-way
}

// withMigrator connects to dsn, detects the engine and runs fn with a
// migrator; ctx bounds connecting.
func withMigrator(ctx context.Context, dsn string, fn func(*migrator) error) error {
	if dsn == "" {
		return invalidArgument("DSN is empty")
	}
	db, err := openDB(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	eng, err := detectEngine(ctx, db, dsn)
	if err != nil {
		return err
	}
	mg, err := newMigrator(ctx, db, dsn, eng)
	if err != nil {
		return err
	}
	defer mg.close()
	return fn(mg)
}

// MigrateUp applies every embedded migration the database at dsn lacks, as
// Open does. It returns a *SchemaVersionError for a dirty or too new schema.
func MigrateUp(ctx context.Context, dsn string) error {
	return withMigrator(ctx, dsn, func(mg *migrator) error { return mg.up() })
}

// MigrateDown reverts the newest steps migrations (steps > 0) of the
// database at dsn. Data of what they created is lost.
func MigrateDown(ctx context.Context, dsn string, steps int) error {
	if steps <= 0 {
		return invalidArgument("MigrateDown: steps is %d, must be positive", steps)
	}
	return withMigrator(ctx, dsn, func(mg *migrator) error {
		v, dirty, err := mg.version()
		if err != nil {
			return err
		}
		if dirty || v > mg.latest {
			return mg.check()
		}
		if uint(steps) > v {
			return invalidArgument("MigrateDown: steps is %d, but the schema is at version %d", steps, v)
		}
		if err := mg.m.Steps(-steps); err != nil {
			return fmt.Errorf("bmdb: migrating down %d steps: %w", steps, err)
		}
		return nil
	})
}

// ReadSchemaInfo returns the schema version of the database at dsn and this
// binary's, without changing anything.
func ReadSchemaInfo(ctx context.Context, dsn string) (SchemaInfo, error) {
	var info SchemaInfo
	err := withMigrator(ctx, dsn, func(mg *migrator) error {
		v, dirty, err := mg.version()
		info = SchemaInfo{Database: v, Binary: mg.latest, Dirty: dirty}
		return err
	})
	return info, err
}
