// Package migrate is bmdb's migration room: it brings bmdb's schema, and
// an application's, to a binary's version with golang-migrate, under a
// lease of its own (lock.go), and tells a binary whether it may use the
// schema it finds. Package bmdb calls it from Open and from its operator
// functions (MigrateUp, MigrateDown, ...).
package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"time"

	gomigrate "github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	"github.com/golang-migrate/migrate/v4/database/cockroachdb"
	"github.com/golang-migrate/migrate/v4/database/postgres"
	"github.com/golang-migrate/migrate/v4/source"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/lib/pq"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/internal/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/dbconn"
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
// (lock.go), read again, and migrate.

// BmdbSourceName names bmdb's own migrations.
const BmdbSourceName = "bmdb"

// Source is one set of migrations.
type Source struct {
	Name   string // BmdbSourceName, or the Application's Name
	FS     fs.FS
	Table  string // golang-migrate's version table
	Latest uint   // the newest version in FS
}

// BmdbSource returns bmdb's own migrations.
func BmdbSource() (*Source, error) {
	return newSource(BmdbSourceName, migrations.FS, "schema_migrations")
}

func newSource(name string, fsys fs.FS, table string) (*Source, error) {
	src, err := iofs.New(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("bmdb: reading the migrations of %s: %w", name, err)
	}
	defer src.Close()
	latest, err := latestVersion(src)
	if err != nil {
		return nil, fmt.Errorf("bmdb: reading the migrations of %s: %w", name, err)
	}
	return &Source{Name: name, FS: fsys, Table: table, Latest: latest}, nil
}

// Sources returns bmdb's migrations and then, if appFS is not nil, the
// application appName's, recorded in <appName>_schema_migrations.
func Sources(appName string, appFS fs.FS) ([]*Source, error) {
	own, err := BmdbSource()
	if err != nil {
		return nil, err
	}
	if appFS == nil {
		return []*Source{own}, nil
	}
	theirs, err := newSource(appName, appFS, appName+"_schema_migrations")
	if err != nil {
		return nil, err
	}
	return []*Source{own, theirs}, nil
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

// Version is what a version table records.
type Version struct {
	Version uint // 0: none
	Dirty   bool
}

// ReadVersion reads src's version table without any lock. A missing table
// is version 0.
func ReadVersion(ctx context.Context, db *sql.DB, src *Source) (Version, error) {
	var v int64
	var dirty bool
	err := db.QueryRowContext(ctx, "SELECT version, dirty FROM "+pq.QuoteIdentifier(src.Table)+" LIMIT 1").Scan(&v, &dirty)
	switch {
	case errors.Is(err, sql.ErrNoRows) || dbconn.SQLState(err) == dbconn.CodeUndefinedTable:
		return Version{}, nil
	case err != nil:
		return Version{}, fmt.Errorf("bmdb: reading the schema version of %s: %w", src.Name, dbconn.ContextError(ctx, err))
	case v < 0:
		return Version{Dirty: dirty}, nil // golang-migrate's "nil version", dirty
	}
	return Version{Version: uint(v), Dirty: dirty}, nil
}

// versionError returns a *SchemaVersionError if v is dirty, newer than src
// or older than it, and nil if it is current.
func (src *Source) versionError(v Version) error {
	verr := &SchemaVersionError{Schema: src.Name, Database: v.Version, Binary: src.Latest, Dirty: v.Dirty}
	switch {
	case v.Dirty:
		verr.Err = ErrSchemaDirty
	case v.Version > src.Latest:
		verr.Err = ErrSchemaTooNew
	case v.Version < src.Latest:
		verr.Err = ErrSchemaTooOld
	default:
		return nil
	}
	return verr
}

// checkNewerSchema accepts src's schema at version v > src.Latest if each
// migration in (latest, v] declared latest's binaries compatible.
func checkNewerSchema(ctx context.Context, db *sql.DB, src *Source, v uint) error {
	tooNew := &SchemaVersionError{Err: ErrSchemaTooNew, Schema: src.Name, Database: v, Binary: src.Latest}
	var row store.SchemaCompatOldestRow
	var err error
	q := store.New(db)
	if src.Name == BmdbSourceName {
		row, err = q.SchemaCompatOldest(ctx, store.SchemaCompatOldestParams{
			KnownVersion: int64(src.Latest), DatabaseVersion: int64(v),
		})
	} else {
		var app store.AppSchemaCompatOldestRow
		app, err = q.AppSchemaCompatOldest(ctx, store.AppSchemaCompatOldestParams{
			Application: src.Name, KnownVersion: int64(src.Latest), DatabaseVersion: int64(v),
		})
		row = store.SchemaCompatOldestRow(app)
	}
	switch {
	case dbconn.SQLState(err) == dbconn.CodeUndefinedTable: // nothing declared
		tooNew.Reason = "the database records no compatibility declarations"
		return tooNew
	case err != nil:
		return fmt.Errorf("bmdb: reading the compatibility of %s's schema: %w", src.Name, dbconn.ContextError(ctx, err))
	case row.Declared != int64(v-src.Latest):
		tooNew.Reason = fmt.Sprintf("only %d of the %d newer migrations declare their compatibility", row.Declared, v-src.Latest)
		return tooNew
	case row.OldestCompatible > int64(src.Latest):
		tooNew.Reason = fmt.Sprintf("a newer migration needs binaries of version %d or later", row.OldestCompatible)
		return tooNew
	}
	klog.Infof("bmdb: %s schema at version %d, newer than this binary's %d; the newer migrations keep version %d working", src.Name, v, src.Latest, src.Latest)
	return nil
}

// acceptWithoutMigrating decides, from a lock-free read, whether src's
// schema can be used as it is: it returns (true, nil) if so, (false, nil)
// if it must be migrated under the lock, and an error if it is refused.
func acceptWithoutMigrating(ctx context.Context, db *sql.DB, src *Source, v Version, apply bool) (bool, error) {
	switch {
	case !v.Dirty && v.Version > src.Latest:
		return true, checkNewerSchema(ctx, db, src, v.Version)
	case !apply:
		return true, src.versionError(v)
	case !v.Dirty && v.Version == src.Latest:
		return true, nil
	}
	// Behind, or dirty: a migration may be running right now; decide
	// under the lock.
	return false, nil
}

// Target is a database to migrate and how to reach it.
type Target struct {
	DSN string
	// NetworkTimeout bounds connecting when the ctx has no deadline.
	NetworkTimeout time.Duration
	// Mode, when enabled, takes CockroachDB's paths on PostgreSQL (package
	// crdbmode): golang-migrate's cockroachdb driver, and files applied one
	// statement at a time as CockroachDB does.
	Mode crdbmode.Settings
	// Cockroach says that the server is CockroachDB (OnOpen's caller has
	// detected it; the other entries detect it themselves): then the
	// steps of that engine (cockroach.go) follow bmdb's migrations.
	Cockroach bool
}

// OnOpen brings every source in srcs to its version (apply), or checks
// that it is usable as it is; db is the caller's pool on t, used for the
// lock-free reads, and info names the caller in the lock.
func OnOpen(ctx context.Context, db *sql.DB, t Target, info string, apply bool, srcs []*Source) error {
	var behind []*Source
	for _, src := range srcs {
		v, err := ReadVersion(ctx, db, src)
		if err != nil {
			return err
		}
		ok, err := acceptWithoutMigrating(ctx, db, src, v, apply)
		if err != nil {
			return err
		}
		if !ok {
			behind = append(behind, src)
		}
	}
	stepPending := false
	if apply && t.Cockroach {
		var err error
		if stepPending, err = cockroachStepPending(ctx, db); err != nil {
			return err
		}
	}
	if len(behind) == 0 && !stepPending {
		return nil
	}
	return withMigrationPool(ctx, t, func(mp *migrationPool) error {
		return mp.locked(ctx, info, func() error {
			for _, src := range behind {
				if err := mp.up(ctx, src); err != nil {
					return err
				}
			}
			return mp.applySteps(ctx)
		})
	})
}

// migrationPool is a pool for migrating: its connections have no lock or
// idle timeout (a migration waits for locks, bounded by ctx) and are cut
// when the ctx it was opened with ends, since golang-migrate's drivers run
// their statements under context.Background().
type migrationPool struct {
	db        *sql.DB
	dsn       string
	cockroach bool // CockroachDB, or cockroach mode
	// realCockroach is set when the server is CockroachDB, not PostgreSQL
	// in cockroach mode.
	realCockroach bool
	conn          *dbconn.Connector
}

// withMigrationPool opens a migration pool on t within ctx, detects the
// engine (cockroach mode counts as CockroachDB) and runs fn.
func withMigrationPool(ctx context.Context, t Target, fn func(*migrationPool) error) error {
	conn, err := dbconn.NewConnector(t.DSN, t.NetworkTimeout, dbconn.Settings{}, dbconn.NewMigrationFaults(t.Mode))
	if err != nil {
		return err
	}
	conn.Bound(ctx)
	db, err := dbconn.OpenPool(ctx, conn, t.DSN)
	if err != nil {
		return err
	}
	defer db.Close()
	cockroach, err := dbconn.IsCockroach(ctx, db, t.DSN)
	if err != nil {
		return err
	}
	return fn(&migrationPool{db: db, dsn: t.DSN, cockroach: cockroach || t.Mode.Enabled, realCockroach: cockroach, conn: conn})
}

// locked runs fn holding the migration lock.
func (mp *migrationPool) locked(ctx context.Context, info string, fn func() error) error {
	lock, err := acquireMigrationLock(ctx, mp.db, info)
	if err != nil {
		return dbconn.RedactError(err, mp.dsn)
	}
	defer lock.release()
	return fn()
}

// migrator returns golang-migrate over src on mp. Close it when done. On
// CockroachDB it uses golang-migrate's cockroachdb driver over a pool of
// its own (which that driver closes), after clearing a lock row left
// behind; on PostgreSQL its postgres driver over one connection.
func (mp *migrationPool) migrator(ctx context.Context, src *Source) (*gomigrate.Migrate, error) {
	files, err := iofs.New(src.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("bmdb: reading the migrations of %s: %w", src.Name, err)
	}
	var drv database.Driver
	if mp.cockroach {
		if err := clearCockroachDriverLock(ctx, mp.db); err != nil {
			files.Close()
			return nil, err
		}
		own := sql.OpenDB(mp.conn)
		drv, err = cockroachdb.WithInstance(own, &cockroachdb.Config{MigrationsTable: src.Table})
		if err != nil {
			own.Close()
		}
	} else {
		var conn *sql.Conn
		conn, err = mp.db.Conn(ctx)
		if err == nil {
			drv, err = postgres.WithConnection(ctx, conn, &postgres.Config{MigrationsTable: src.Table})
			if err != nil {
				conn.Close()
			}
		}
	}
	if err != nil {
		files.Close()
		return nil, fmt.Errorf("bmdb: preparing the migrations of %s: %w", src.Name, dbconn.RedactError(dbconn.ContextError(ctx, err), mp.dsn))
	}
	m, err := gomigrate.NewWithInstance("iofs", files, mp.engineName(), drv)
	if err != nil {
		drv.Close()
		files.Close()
		return nil, fmt.Errorf("bmdb: preparing the migrations of %s: %w", src.Name, err)
	}
	m.Log = migrateLogger{}
	return m, nil
}

// engineName names mp's engine for golang-migrate.
func (mp *migrationPool) engineName() string {
	if mp.cockroach {
		return "CockroachDB"
	}
	return "PostgreSQL"
}

// closeMigrator closes m, logging what fails.
func closeMigrator(m *gomigrate.Migrate) {
	srcErr, dbErr := m.Close()
	if err := errors.Join(srcErr, dbErr); err != nil {
		klog.Warningf("bmdb: closing migrator: %v", err)
	}
}

// run runs step (Up, Steps, ...) on src's migrator, stopping between
// migrations when ctx ends (a migration cut short by ctx is left dirty by
// golang-migrate).
func (mp *migrationPool) run(ctx context.Context, src *Source, step func(*gomigrate.Migrate) error) error {
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
	if err == nil || errors.Is(err, gomigrate.ErrNoChange) {
		return nil
	}
	var dirty gomigrate.ErrDirty
	if errors.As(err, &dirty) {
		return &SchemaVersionError{Err: ErrSchemaDirty, Schema: src.Name, Database: uint(dirty.Version), Binary: src.Latest, Dirty: true}
	}
	return fmt.Errorf("bmdb: migrating %s: %w", src.Name, dbconn.RedactError(dbconn.ContextError(ctx, err), mp.dsn))
}

// up migrates src to its newest version, under the lock: it reads the
// version again, refuses a dirty or too new one, and applies what is
// missing.
func (mp *migrationPool) up(ctx context.Context, src *Source) error {
	v, err := ReadVersion(ctx, mp.db, src)
	if err != nil {
		return err
	}
	switch {
	case v.Dirty:
		return mp.recoverDirty(ctx, src, v)
	case v.Version > src.Latest:
		return checkNewerSchema(ctx, mp.db, src, v.Version)
	case v.Version == src.Latest:
		return nil
	}
	klog.Infof("bmdb: migrating %s from version %d to %d", src.Name, v.Version, src.Latest)
	return mp.run(ctx, src, (*gomigrate.Migrate).Up)
}

// rerunnableMarker, on a line of its own in an up file, says that every
// statement of the file is safe to run again from any partial state
// (package migrations).
const rerunnableMarker = "-- bmdb:rerunnable"

// recoverDirty migrates src up from v, a dirty version (a migration failed
// half-way, or a migrator died in it), under the lock: if v's up file is
// marked rerunnableMarker it forces the previous version and runs the file
// again, then the rest; otherwise it refuses, saying what to repair.
func (mp *migrationPool) recoverDirty(ctx context.Context, src *Source, v Version) error {
	if v.Version > src.Latest {
		return src.versionError(v)
	}
	files, err := iofs.New(src.FS, ".")
	if err != nil {
		return fmt.Errorf("bmdb: reading the migrations of %s: %w", src.Name, err)
	}
	defer files.Close()
	rerunnable, name, err := readRerunnable(files, v.Version)
	if err != nil {
		return fmt.Errorf("bmdb: reading migration %d of %s: %w", v.Version, src.Name, err)
	}
	prev := -1 // golang-migrate's "no version"
	if p, err := files.Prev(v.Version); err == nil {
		prev = int(p)
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("bmdb: reading the migrations of %s: %w", src.Name, err)
	}
	if !rerunnable {
		verr := src.versionError(v).(*SchemaVersionError)
		verr.Reason = fmt.Sprintf("its file %s is not marked %q, so it may have been applied in part: "+
			"make the schema match version %d (drop what the file created) or %d (finish it), then force that version with golang-migrate",
			name, rerunnableMarker, max(prev, 0), v.Version)
		return verr
	}
	klog.Warningf("bmdb: %s schema version %d is dirty (a migration failed half-way); %s is safe to run again: forcing version %d and migrating up",
		src.Name, v.Version, name, max(prev, 0))
	return mp.run(ctx, src, func(m *gomigrate.Migrate) error {
		if err := m.Force(prev); err != nil {
			return err
		}
		return m.Up()
	})
}

// readRerunnable reports whether version's up file in files carries
// rerunnableMarker, and names the file.
func readRerunnable(files source.Driver, version uint) (bool, string, error) {
	r, name, err := files.ReadUp(version)
	if err != nil {
		return false, "", err
	}
	defer r.Close()
	body, err := io.ReadAll(r)
	if err != nil {
		return false, "", err
	}
	name = fmt.Sprintf("%06d_%s.up.sql", version, name)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), rerunnableMarker) {
			return true, name, nil
		}
	}
	return false, name, nil
}

// migrateLogger sends golang-migrate's log to klog.
type migrateLogger struct{}

func (migrateLogger) Printf(format string, v ...any) { klog.V(2).Infof("migrate: "+format, v...) }
func (migrateLogger) Verbose() bool                  { return klog.V(2).Enabled() }

// Info describes a database's schema version against this binary's.
type Info struct {
	Database uint // the version recorded in the database (0: none)
	Binary   uint // the newest version embedded in this binary
	Dirty    bool // a migration failed half-way
}

// Up applies every one of bmdb's embedded migrations the database lacks,
// as Open does (waiting for the migration lock). It returns a
// *SchemaVersionError for a dirty or too new schema.
func Up(ctx context.Context, t Target, info string) error {
	return withLock(ctx, t, info, func(mp *migrationPool, src *Source) error {
		if err := mp.up(ctx, src); err != nil {
			return err
		}
		return mp.applySteps(ctx)
	})
}

// ErrTooManySteps is returned by Down for more steps than the schema has.
var ErrTooManySteps = errors.New("bmdb: more steps than migrations applied")

// Down reverts the newest steps (> 0) of bmdb's migrations, holding the
// migration lock.
func Down(ctx context.Context, t Target, info string, steps int) error {
	return withLock(ctx, t, info, func(mp *migrationPool, src *Source) error {
		v, err := ReadVersion(ctx, mp.db, src)
		if err != nil {
			return err
		}
		if v.Dirty || v.Version > src.Latest {
			return src.versionError(v)
		}
		if uint(steps) > v.Version {
			return fmt.Errorf("%w: steps is %d, but the schema is at version %d", ErrTooManySteps, steps, v.Version)
		}
		return mp.run(ctx, src, func(m *gomigrate.Migrate) error { return m.Steps(-steps) })
	})
}

// To migrates src up or down to version, holding the lock (tests build old
// schemas with it).
func To(ctx context.Context, t Target, src *Source, version uint) error {
	return withMigrationPool(ctx, t, func(mp *migrationPool) error {
		return mp.locked(ctx, "migrate.To", func() error {
			return mp.run(ctx, src, func(m *gomigrate.Migrate) error { return m.Migrate(version) })
		})
	})
}

// withLock runs fn on bmdb's own migrations, holding the lock.
func withLock(ctx context.Context, t Target, info string, fn func(*migrationPool, *Source) error) error {
	src, err := BmdbSource()
	if err != nil {
		return err
	}
	return withMigrationPool(ctx, t, func(mp *migrationPool) error {
		return mp.locked(ctx, info, func() error { return fn(mp, src) })
	})
}

// ReadInfo returns the schema version of the database and this binary's,
// without changing anything and without taking any lock.
func ReadInfo(ctx context.Context, t Target) (Info, error) {
	src, err := BmdbSource()
	if err != nil {
		return Info{}, err
	}
	var info Info
	err = withMigrationPool(ctx, t, func(mp *migrationPool) error {
		v, err := ReadVersion(ctx, mp.db, src)
		info = Info{Database: v.Version, Binary: src.Latest, Dirty: v.Dirty}
		return err
	})
	return info, err
}
