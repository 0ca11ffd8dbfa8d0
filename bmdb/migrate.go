package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	"github.com/golang-migrate/migrate/v4/database/cockroachdb"
	"github.com/golang-migrate/migrate/v4/database/postgres"
	"github.com/golang-migrate/migrate/v4/source"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/lib/pq"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/internal/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/migrations"
)

// Schemas are migrated by golang-migrate, one source after the other:
// bmdb's own migrations (package migrations, version table
// schema_migrations), then the application's, if Config.Application names
// one (version table <name>_schema_migrations). Versions are read with a
// plain SELECT, without any lock, so that any number of components can
// Open at once; only when a source is behind (or looks dirty, which is what
// a migration in progress looks like) does Open take the migration lock
// (migrationlock.go), read again, and migrate.

// bmdbSourceName names bmdb's own migrations.
const bmdbSourceName = "bmdb"

// schemaSource is one set of migrations.
type schemaSource struct {
	name   string // bmdbSourceName, or the Application's Name
	fs     fs.FS
	table  string // golang-migrate's version table
	latest uint   // the newest version in fs
}

// bmdbSource returns bmdb's own migrations.
func bmdbSource() (*schemaSource, error) {
	return newSource(bmdbSourceName, migrations.FS, "schema_migrations")
}

func newSource(name string, fsys fs.FS, table string) (*schemaSource, error) {
	src, err := iofs.New(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("bmdb: reading the migrations of %s: %w", name, err)
	}
	defer src.Close()
	latest, err := latestVersion(src)
	if err != nil {
		return nil, fmt.Errorf("bmdb: reading the migrations of %s: %w", name, err)
	}
	return &schemaSource{name: name, fs: fsys, table: table, latest: latest}, nil
}

// sources returns bmdb's migrations and then app's, if any.
func sources(app *Application) ([]*schemaSource, error) {
	own, err := bmdbSource()
	if err != nil {
		return nil, err
	}
	if app == nil {
		return []*schemaSource{own}, nil
	}
	theirs, err := newSource(app.Name, app.Migrations, app.Name+"_schema_migrations")
	if err != nil {
		return nil, err
	}
	return []*schemaSource{own, theirs}, nil
}

// latestVersion returns the newest migration version in src.
func latestVersion(src source.Driver) (uint, error) {
	v, err := src.First()
	if err != nil {
		return 0, err
	}
	for {
		next, err := src.Next(v)
		if errors.Is(err, os.ErrNotExist) {
			return v, nil
		}
		if err != nil {
			return 0, err
		}
		v = next
	}
}

// schemaVersion is what a version table records.
type schemaVersion struct {
	version uint // 0: none
	dirty   bool
}

// readVersion reads src's version table without any lock. A missing table
// is version 0.
func readVersion(ctx context.Context, db *sql.DB, src *schemaSource) (schemaVersion, error) {
	var v int64
	var dirty bool
	err := db.QueryRowContext(ctx, "SELECT version, dirty FROM "+pq.QuoteIdentifier(src.table)+" LIMIT 1").Scan(&v, &dirty)
	switch {
	case errors.Is(err, sql.ErrNoRows) || sqlState(err) == codeUndefinedTable:
		return schemaVersion{}, nil
	case err != nil:
		return schemaVersion{}, fmt.Errorf("bmdb: reading the schema version of %s: %w", src.name, contextError(ctx, err))
	case v < 0:
		return schemaVersion{dirty: dirty}, nil // golang-migrate's "nil version", dirty
	}
	return schemaVersion{version: uint(v), dirty: dirty}, nil
}

// versionError returns a *SchemaVersionError if v is dirty, newer than src
// or older than it, and nil if it is current.
func (src *schemaSource) versionError(v schemaVersion) error {
	verr := &SchemaVersionError{Schema: src.name, Database: v.version, Binary: src.latest, Dirty: v.dirty}
	switch {
	case v.dirty:
		verr.Err = ErrSchemaDirty
	case v.version > src.latest:
		verr.Err = ErrSchemaTooNew
	case v.version < src.latest:
		verr.Err = ErrSchemaTooOld
	default:
		return nil
	}
	return verr
}

// checkNewerSchema accepts src's schema at version v > src.latest if each
// migration in (latest, v] declared latest's binaries compatible.
func checkNewerSchema(ctx context.Context, db *sql.DB, src *schemaSource, v uint) error {
	tooNew := &SchemaVersionError{Err: ErrSchemaTooNew, Schema: src.name, Database: v, Binary: src.latest}
	var row store.SchemaCompatOldestRow
	var err error
	q := store.New(db)
	if src.name == bmdbSourceName {
		row, err = q.SchemaCompatOldest(ctx, store.SchemaCompatOldestParams{
			KnownVersion: int64(src.latest), DatabaseVersion: int64(v),
		})
	} else {
		var app store.AppSchemaCompatOldestRow
		app, err = q.AppSchemaCompatOldest(ctx, store.AppSchemaCompatOldestParams{
			Application: src.name, KnownVersion: int64(src.latest), DatabaseVersion: int64(v),
		})
		row = store.SchemaCompatOldestRow(app)
	}
	switch {
	case sqlState(err) == codeUndefinedTable: // nothing declared
		tooNew.Reason = "the database records no compatibility declarations"
		return tooNew
	case err != nil:
		return fmt.Errorf("bmdb: reading the compatibility of %s's schema: %w", src.name, contextError(ctx, err))
	case row.Declared != int64(v-src.latest):
		tooNew.Reason = fmt.Sprintf("only %d of the %d newer migrations declare their compatibility", row.Declared, v-src.latest)
		return tooNew
	case row.OldestCompatible > int64(src.latest):
		tooNew.Reason = fmt.Sprintf("a newer migration needs binaries of version %d or later", row.OldestCompatible)
		return tooNew
	}
	klog.Infof("bmdb: %s schema at version %d, newer than this binary's %d; the newer migrations keep version %d working", src.name, v, src.latest, src.latest)
	return nil
}

// acceptWithoutMigrating decides, from a lock-free read, whether src's
// schema can be used as it is: it returns (true, nil) if so, (false, nil)
// if it must be migrated under the lock, and an error if it is refused.
func acceptWithoutMigrating(ctx context.Context, db *sql.DB, src *schemaSource, v schemaVersion, apply bool) (bool, error) {
	switch {
	case !v.dirty && v.version > src.latest:
		return true, checkNewerSchema(ctx, db, src, v.version)
	case !apply:
		return true, src.versionError(v)
	case !v.dirty && v.version == src.latest:
		return true, nil
	}
	// Behind, or dirty: a migration may be running right now; decide
	// under the lock.
	return false, nil
}

// migrateOnOpen brings every source of c to its version (apply), or checks
// that it is usable as it is.
func migrateOnOpen(ctx context.Context, c *Connection, apply bool) error {
	srcs, err := sources(c.cfg.Application)
	if err != nil {
		return err
	}
	var behind []*schemaSource
	for _, src := range srcs {
		v, err := readVersion(ctx, c.db, src)
		if err != nil {
			return err
		}
		ok, err := acceptWithoutMigrating(ctx, c.db, src, v, apply)
		if err != nil {
			return err
		}
		if !ok {
			behind = append(behind, src)
		}
	}
	if len(behind) == 0 {
		return nil
	}
	info := c.cfg.ComponentName
	if c.cfg.RuntimeInfo != "" {
		info += " (" + c.cfg.RuntimeInfo + ")"
	}
	return withMigrationPool(ctx, c.cfg.DSN, c.cfg.NetworkTimeout, c.cfg.mode().Enabled, func(mp *migrationPool) error {
		return mp.locked(ctx, info, func() error {
			for _, src := range behind {
				if err := mp.up(ctx, src); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

// migrationPool is a pool for migrating: its connections have no lock or
// idle timeout (a migration waits for locks, bounded by ctx) and are cut
// when the ctx it was opened with ends, since golang-migrate's drivers run
// their statements under context.Background().
type migrationPool struct {
	db     *sql.DB
	dsn    string
	engine engine
	conn   *connector
}

// withMigrationPool opens a migration pool on dsn within ctx, detects the
// engine (cockroach mode counts as CockroachDB) and runs fn.
func withMigrationPool(ctx context.Context, dsn string, timeout time.Duration, cockroachMode bool, fn func(*migrationPool) error) error {
	conn, err := newConnector(dsn, timeout, connSettings{}, nil)
	if err != nil {
		return err
	}
	conn.base = ctx
	db, err := openPool(ctx, conn, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	eng, err := detectEngine(ctx, db, dsn)
	if err != nil {
		return err
	}
	if cockroachMode {
		eng = engineCockroach
	}
	return fn(&migrationPool{db: db, dsn: dsn, engine: eng, conn: conn})
}

// locked runs fn holding the migration lock.
func (mp *migrationPool) locked(ctx context.Context, info string, fn func() error) error {
	lock, err := acquireMigrationLock(ctx, mp.db, info)
	if err != nil {
		return redactError(err, mp.dsn)
	}
	defer lock.release()
	return fn()
}

// migrator returns golang-migrate over src on mp. Close it when done. On
// CockroachDB it uses golang-migrate's cockroachdb driver over a pool of
// its own (which that driver closes), after clearing a lock row left
// behind; on PostgreSQL its postgres driver over one connection.
func (mp *migrationPool) migrator(ctx context.Context, src *schemaSource) (*migrate.Migrate, error) {
	files, err := iofs.New(src.fs, ".")
	if err != nil {
		return nil, fmt.Errorf("bmdb: reading the migrations of %s: %w", src.name, err)
	}
	var drv database.Driver
	if mp.engine == engineCockroach {
		if err := clearCockroachDriverLock(ctx, mp.db); err != nil {
			files.Close()
			return nil, err
		}
		own := sql.OpenDB(mp.conn)
		drv, err = cockroachdb.WithInstance(own, &cockroachdb.Config{MigrationsTable: src.table})
		if err != nil {
			own.Close()
		}
	} else {
		var conn *sql.Conn
		conn, err = mp.db.Conn(ctx)
		if err == nil {
			drv, err = postgres.WithConnection(ctx, conn, &postgres.Config{MigrationsTable: src.table})
			if err != nil {
				conn.Close()
			}
		}
	}
	if err != nil {
		files.Close()
		return nil, fmt.Errorf("bmdb: preparing the migrations of %s: %w", src.name, redactError(contextError(ctx, err), mp.dsn))
	}
	m, err := migrate.NewWithInstance("iofs", files, mp.engine.String(), drv)
	if err != nil {
		drv.Close()
		files.Close()
		return nil, fmt.Errorf("bmdb: preparing the migrations of %s: %w", src.name, err)
	}
	m.Log = migrateLogger{}
	return m, nil
}

// closeMigrator closes m, logging what fails.
func closeMigrator(m *migrate.Migrate) {
	srcErr, dbErr := m.Close()
	if err := errors.Join(srcErr, dbErr); err != nil {
		klog.Warningf("bmdb: closing migrator: %v", err)
	}
}

// run runs step (Up, Steps, ...) on src's migrator, stopping between
// migrations when ctx ends (a migration cut short by ctx is left dirty by
// golang-migrate).
func (mp *migrationPool) run(ctx context.Context, src *schemaSource, step func(*migrate.Migrate) error) error {
	m, err := mp.migrator(ctx, src)
	if err != nil {
		return err
	}
	defer closeMigrator(m)
	stop := context.AfterFunc(ctx, func() {
		select {
		case m.GracefulStop <- true:
		default:
		}
	})
	defer stop()
	err = step(m)
	if err == nil || errors.Is(err, migrate.ErrNoChange) {
		return nil
	}
	var dirty migrate.ErrDirty
	if errors.As(err, &dirty) {
		return &SchemaVersionError{Err: ErrSchemaDirty, Schema: src.name, Database: uint(dirty.Version), Binary: src.latest, Dirty: true}
	}
	return fmt.Errorf("bmdb: migrating %s: %w", src.name, redactError(contextError(ctx, err), mp.dsn))
}

// up migrates src to its newest version, under the lock: it reads the
// version again, refuses a dirty or too new one, and applies what is
// missing.
func (mp *migrationPool) up(ctx context.Context, src *schemaSource) error {
	v, err := readVersion(ctx, mp.db, src)
	if err != nil {
		return err
	}
	switch {
	case v.dirty:
		return src.versionError(v)
	case v.version > src.latest:
		return checkNewerSchema(ctx, mp.db, src, v.version)
	case v.version == src.latest:
		return nil
	}
	klog.Infof("bmdb: migrating %s from version %d to %d", src.name, v.version, src.latest)
	return mp.run(ctx, src, (*migrate.Migrate).Up)
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

// withAdminPool connects to dsn within ctx (a migration pool: no timeouts
// on locks, every call cut when ctx ends) and runs fn.
func withAdminPool(ctx context.Context, dsn string, fn func(*sql.DB, engine) error) error {
	if dsn == "" {
		return invalidArgument("DSN is empty")
	}
	return withMigrationPool(ctx, dsn, 2*SessionIntervalDefault, crdbmode.Get().Enabled, func(mp *migrationPool) error { return fn(mp.db, mp.engine) })
}

// MigrateUp applies every embedded migration the database at dsn lacks, as
// Open does (waiting for the migration lock). It returns a
// *SchemaVersionError for a dirty or too new schema.
func MigrateUp(ctx context.Context, dsn string) error {
	return migrateWithLock(ctx, dsn, "bmdb.MigrateUp", func(mp *migrationPool, src *schemaSource) error {
		return mp.up(ctx, src)
	})
}

// MigrateDown reverts the newest steps migrations (steps > 0) of the
// database at dsn, holding the migration lock. Data of what they created is
// lost.
func MigrateDown(ctx context.Context, dsn string, steps int) error {
	if steps <= 0 {
		return invalidArgument("MigrateDown: steps is %d, must be positive", steps)
	}
	return migrateWithLock(ctx, dsn, "bmdb.MigrateDown", func(mp *migrationPool, src *schemaSource) error {
		v, err := readVersion(ctx, mp.db, src)
		if err != nil {
			return err
		}
		if v.dirty || v.version > src.latest {
			return src.versionError(v)
		}
		if uint(steps) > v.version {
			return invalidArgument("MigrateDown: steps is %d, but the schema is at version %d", steps, v.version)
		}
		return mp.run(ctx, src, func(m *migrate.Migrate) error { return m.Steps(-steps) })
	})
}

// migrateWithLock runs fn on bmdb's own migrations, holding the lock.
func migrateWithLock(ctx context.Context, dsn, info string, fn func(*migrationPool, *schemaSource) error) error {
	if dsn == "" {
		return invalidArgument("DSN is empty")
	}
	src, err := bmdbSource()
	if err != nil {
		return err
	}
	return withMigrationPool(ctx, dsn, 2*SessionIntervalDefault, crdbmode.Get().Enabled, func(mp *migrationPool) error {
		return mp.locked(ctx, info, func() error { return fn(mp, src) })
	})
}

// ReadSchemaInfo returns the schema version of the database at dsn and this
// binary's, without changing anything and without taking any lock.
func ReadSchemaInfo(ctx context.Context, dsn string) (SchemaInfo, error) {
	src, err := bmdbSource()
	if err != nil {
		return SchemaInfo{}, err
	}
	var info SchemaInfo
	err = withAdminPool(ctx, dsn, func(db *sql.DB, _ engine) error {
		v, err := readVersion(ctx, db, src)
		info = SchemaInfo{Database: v.version, Binary: src.latest, Dirty: v.dirty}
		return err
	})
	return info, err
}
