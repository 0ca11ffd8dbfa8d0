package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"

	gomigrate "github.com/golang-migrate/migrate/v4"
	gosource "github.com/golang-migrate/migrate/v4/source"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/lib/pq"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/store"
)

// Schemas are migrated by golang-migrate, one source after the other:
// bmdb's own migrations (FS, version table schema_migrations), then the
// application's, if Config.Application names one (version table
// <name>_schema_migrations). Versions are read with a plain SELECT,
// without any lock, so that any number of components can Open at once;
// only when a source is behind (or looks dirty, which is what a migration
// in progress looks like) does a Migrator take the migration lease
// (lock.go), read again, and migrate.

// SchemaBmdb names bmdb's own schema in SchemaVersion.Schema and
// SchemaVersionError.Schema, and as the schema argument of Migrator.Down
// and Migrator.Force. An Application cannot be named so.
const SchemaBmdb = "bmdb"

// source is one set of migrations.
type source struct {
	name     string                        // SchemaBmdb, or the Application's Name
	fsys     fs.FS                         // nil: the Migrator does not have the files (an application known only by its table)
	table    string                        // golang-migrate's version table
	versions []uint                        // the versions of fsys's up files, in order
	latest   uint                          // the newest of versions (0: no files)
	files    map[uint]map[Direction]string // the file of each version and direction
}

// bmdbSource returns bmdb's own migrations.
func bmdbSource() (*source, error) {
	return newSource(SchemaBmdb, FS, "schema_migrations")
}

// versionTable names the version table of the application name.
func versionTable(name string) string { return name + "_schema_migrations" }

func newSource(name string, fsys fs.FS, table string) (*source, error) {
	src, err := iofs.New(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("migrations: reading the migrations of %s: %w", describe(name), err)
	}
	defer src.Close()
	versions, err := listVersions(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("migrations: reading the migrations of %s: no NNNNNN_title.up.sql file: %w", describe(name), err)
	}
	if err != nil {
		return nil, fmt.Errorf("migrations: reading the migrations of %s: %w", describe(name), err)
	}
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("migrations: reading the migrations of %s: %w", describe(name), err)
	}
	files := map[uint]map[Direction]string{}
	for _, e := range entries {
		if m, err := gosource.DefaultParse(e.Name()); err == nil {
			if files[m.Version] == nil {
				files[m.Version] = map[Direction]string{}
			}
			files[m.Version][Direction(m.Direction)] = e.Name()
		}
	}
	return &source{name: name, fsys: fsys, table: table, versions: versions, latest: versions[len(versions)-1], files: files}, nil
}

// fileName names src's file of version in direction d, or says there is
// none.
func (src *source) fileName(version uint, d Direction) string {
	if name := src.files[version][d]; name != "" {
		return name
	}
	return fmt.Sprintf("version %d's %s file", version, d)
}

// tableOnly returns the source of an application this Migrator has no
// files of, known only by its version table.
func tableOnly(name string) *source {
	return &source{name: name, table: versionTable(name)}
}

// sources returns bmdb's migrations and then, if app is not nil, the
// application's.
func sources(app *Application) ([]*source, error) {
	own, err := bmdbSource()
	if err != nil {
		return nil, err
	}
	if app == nil {
		return []*source{own}, nil
	}
	theirs, err := newSource(app.Name, app.Migrations, versionTable(app.Name))
	if err != nil {
		return nil, err
	}
	return []*source{own, theirs}, nil
}

// listVersions returns the migration versions in src, in order.
func listVersions(src gosource.Driver) ([]uint, error) {
	v, err := src.First()
	if err != nil {
		return nil, err
	}
	versions := []uint{v}
	for {
		next, err := src.Next(v)
		if errors.Is(err, os.ErrNotExist) {
			return versions, nil
		}
		if err != nil {
			return nil, err
		}
		versions = append(versions, next)
		v = next
	}
}

// describe names src in errors.
func (src *source) describe() string { return describe(src.name) }

// describe names the schema name in errors.
func describe(name string) string {
	if name == SchemaBmdb {
		return "bmdb's schema"
	}
	return "application " + name
}

// recorded is what a version table records.
type recorded struct {
	version uint // 0: none
	dirty   bool
}

// readVersion reads src's version table without any lock. A missing table
// is version 0.
func readVersion(ctx context.Context, db *sql.DB, src *source) (recorded, error) {
	var v int64
	var dirty bool
	err := db.QueryRowContext(ctx, "SELECT version, dirty FROM "+pq.QuoteIdentifier(src.table)+" LIMIT 1").Scan(&v, &dirty)
	switch {
	case errors.Is(err, sql.ErrNoRows) || dbconn.SQLState(err) == dbconn.CodeUndefinedTable:
		return recorded{}, nil
	case err != nil:
		return recorded{}, fmt.Errorf("migrations: reading the version of %s (table %s): %w", src.describe(), src.table, dbconn.ContextError(ctx, err))
	case v < 0:
		return recorded{dirty: dirty}, nil // golang-migrate's "nil version", dirty
	}
	return recorded{version: uint(v), dirty: dirty}, nil
}

// versionError returns a *SchemaVersionError if v is newer than src or
// older than it (a dirty v is dirtyError's), and nil if it is current.
func (src *source) versionError(v recorded) error {
	verr := &SchemaVersionError{Schema: src.name, Table: src.table, Database: v.version, Binary: src.latest}
	switch {
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
func checkNewerSchema(ctx context.Context, db *sql.DB, src *source, v uint) error {
	tooNew := &SchemaVersionError{Err: ErrSchemaTooNew, Schema: src.name, Table: src.table, Database: v, Binary: src.latest}
	var row store.SchemaCompatOldestRow
	var err error
	q := store.New(db)
	if src.name == SchemaBmdb {
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
	case dbconn.SQLState(err) == dbconn.CodeUndefinedTable: // nothing declared
		tooNew.Reason = "the database records no compatibility declarations"
		return tooNew
	case err != nil:
		return fmt.Errorf("migrations: reading the compatibility of %s: %w", src.describe(), dbconn.ContextError(ctx, err))
	case row.Declared != int64(v-src.latest):
		tooNew.Reason = fmt.Sprintf("only %d of the %d newer migrations declare their compatibility", row.Declared, v-src.latest)
		return tooNew
	case row.OldestCompatible > int64(src.latest):
		tooNew.Reason = fmt.Sprintf("a newer migration needs binaries of version %d or later", row.OldestCompatible)
		return tooNew
	}
	klog.Infof("migrations: %s at version %d, newer than this binary's %d; the newer migrations keep version %d working", src.describe(), v, src.latest, src.latest)
	return nil
}

// acceptWithoutMigrating decides, from a lock-free read, whether src's
// schema can be used as it is: it returns (true, nil) if so, (false, nil)
// if it must be migrated under the lease, and an error if it is refused.
func acceptWithoutMigrating(ctx context.Context, db *sql.DB, src *source, v recorded, apply bool) (bool, error) {
	switch {
	case !v.dirty && v.version > src.latest:
		return true, checkNewerSchema(ctx, db, src, v.version)
	case !apply && v.dirty:
		return true, dirtyError(ctx, db, src, v)
	case !apply:
		return true, src.versionError(v)
	case !v.dirty && v.version == src.latest:
		return true, nil
	}
	// Behind, or dirty: a migration may be running right now; decide
	// under the lease.
	return false, nil
}

// target is the database a Migrator migrates: its pool, and its engine.
type target struct {
	db *sql.DB
	// cockroach says that the server is CockroachDB: then files run one
	// statement at a time (driver.go), and the steps of that engine
	// (cockroach.go) follow bmdb's migrations.
	cockroach bool
}

// migrate brings every source of m to its version (apply), or checks that
// it is usable as it is, and returns what it ran: it reads the versions on
// m's pool without any lock, and migrates under the lease only what is
// behind (or dirty).
func (m *Migrator) migrate(ctx context.Context, apply bool) (*Result, error) {
	res := &Result{}
	var behind []*source
	for _, src := range m.srcs {
		v, err := readVersion(ctx, m.db, src)
		if err != nil {
			return res, err
		}
		ok, err := acceptWithoutMigrating(ctx, m.db, src, v, apply)
		if err != nil {
			return res, err
		}
		if !ok {
			behind = append(behind, src)
		}
	}
	if !apply {
		return res, nil
	}
	t, err := m.target(ctx)
	if err != nil {
		return res, err
	}
	stepPending := false
	if t.cockroach {
		if stepPending, err = cockroachStepPending(ctx, t.db); err != nil {
			return res, err
		}
	}
	if len(behind) == 0 && !stepPending {
		return res, nil
	}
	err = t.locked(ctx, m.holderInfo, func() error {
		for _, src := range behind {
			ran, err := t.up(ctx, src)
			res.Migrations = append(res.Migrations, ran...)
			if err != nil {
				return err
			}
		}
		steps, err := t.applySteps(ctx)
		res.CockroachSteps = steps
		return err
	})
	return res, err
}

// connectionsToMigrate is how many connections of the pool a migration
// holds at once: the migration's, and the lease renewal's.
const connectionsToMigrate = 2

// locked runs fn holding the migration lease. A pool limited to fewer
// connections than a migration holds is refused (see Migrator): on one
// connection, held by the migration, the lease could not be renewed, and
// would expire under a migration longer than it.
func (t *target) locked(ctx context.Context, info string, fn func() error) error {
	if n := t.db.Stats().MaxOpenConnections; n > 0 && n < connectionsToMigrate {
		return invalidArgument("the pool is limited to %d open connection (sql.DB.SetMaxOpenConns; bmdb.Config.MaxOpenConns): migrating holds %d at once, "+
			"one running the migration and one renewing the migration lease; allow %d or more, or migrate before (bmdbctl migrate up)", n, connectionsToMigrate, connectionsToMigrate)
	}
	lock, err := acquireMigrationLock(ctx, t.db, info)
	if err != nil {
		return err
	}
	defer lock.release()
	return fn()
}

// noFiles is an empty file system: the source golang-migrate needs to
// force a version of a schema the Migrator has no files of.
type noFiles struct{}

func (noFiles) Open(name string) (fs.File, error) {
	return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
}

func (noFiles) ReadDir(name string) ([]fs.DirEntry, error) {
	if name == "." {
		return nil, nil
	}
	return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrNotExist}
}

// migrator returns golang-migrate over src on a connection of t's pool
// (migrationDriver). Close it when done, before the pool is used again:
// that closes the connection. Of a schema the Migrator has no files of
// it can only force a version.
func (t *target) migrator(ctx context.Context, src *source) (*gomigrate.Migrate, *migrationDriver, error) {
	fsys := src.fsys
	switch {
	case fsys == nil:
		fsys = noFiles{}
	case src.name == SchemaBmdb:
		fsys = typesFS{FS: fsys, cockroach: t.cockroach}
	}
	files, err := iofs.New(fsys, ".")
	if err != nil {
		return nil, nil, fmt.Errorf("migrations: reading the migrations of %s: %w", src.describe(), err)
	}
	drv, err := openDriver(ctx, t.db, src, t.cockroach)
	if err != nil {
		files.Close()
		return nil, nil, err
	}
	m, err := gomigrate.NewWithInstance("iofs", files, t.engineName(), drv)
	if err != nil {
		drv.Close()
		files.Close()
		return nil, nil, fmt.Errorf("migrations: preparing the migrations of %s: %w", src.describe(), err)
	}
	m.Log = migrateLogger{}
	// golang-migrate reads the files ahead into a channel of this size
	// and, if a migration fails, leaves its reader blocked on a full one:
	// room for every file lets it finish.
	m.PrefetchMigrations = max(m.PrefetchMigrations, uint(len(src.versions))+1)
	return m, drv, nil
}

// engineName names t's engine for golang-migrate.
func (t *target) engineName() string {
	if t.cockroach {
		return "CockroachDB"
	}
	return "PostgreSQL"
}

// closeMigrator closes m, logging what fails.
func closeMigrator(m *gomigrate.Migrate) {
	srcErr, dbErr := m.Close()
	if err := errors.Join(srcErr, dbErr); err != nil {
		klog.Warningf("migrations: closing migrator: %v", err)
	}
}

// run runs step (Up, Steps, ...) on src's migrator, stopping between
// migrations when ctx ends (a migration cut short by ctx is left dirty by
// golang-migrate), and returns the migrations that ran. The migrator's
// connection is closed before anything else reads the pool.
func (t *target) run(ctx context.Context, src *source, step func(*gomigrate.Migrate) error) ([]Migration, error) {
	m, drv, err := t.migrator(ctx, src)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() {
		select {
		case m.GracefulStop <- true:
		default:
		}
	})
	err = step(m)
	stop()
	closeMigrator(m)
	ran := drv.done
	if err == nil || errors.Is(err, gomigrate.ErrNoChange) {
		return ran, nil
	}
	var dirty gomigrate.ErrDirty
	if errors.As(err, &dirty) {
		return ran, dirtyError(ctx, t.db, src, recorded{version: uint(dirty.Version), dirty: true})
	}
	return ran, fmt.Errorf("migrations: migrating %s: %w", src.describe(), dbconn.ContextError(ctx, err))
}

// up migrates src to its newest version, under the lease: it reads the
// version again, recovers or refuses a dirty one, refuses a too new one,
// and applies what is missing.
func (t *target) up(ctx context.Context, src *source) ([]Migration, error) {
	v, err := readVersion(ctx, t.db, src)
	if err != nil {
		return nil, err
	}
	switch {
	case v.dirty:
		return t.recoverDirty(ctx, src, v)
	case v.version > src.latest:
		return nil, checkNewerSchema(ctx, t.db, src, v.version)
	case v.version == src.latest:
		return nil, nil
	}
	klog.Infof("migrations: migrating %s from version %d to %d", src.describe(), v.version, src.latest)
	return t.run(ctx, src, (*gomigrate.Migrate).Up)
}

// migrateLogger sends golang-migrate's log to klog.
type migrateLogger struct{}

func (migrateLogger) Printf(format string, v ...any) { klog.V(2).Infof("migrate: "+format, v...) }
func (migrateLogger) Verbose() bool                  { return klog.V(2).Enabled() }
