package migrations

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	gomigrate "github.com/golang-migrate/migrate/v4"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/procinfo"
)

// MaxHolderInfoLength is the longest Config.HolderInfo, in bytes.
const MaxHolderInfoLength = 4096

// Config configures a Migrator. A nil *Config is the zero Config: bmdb's
// schema only, with every default.
type Config struct {
	// Application, if not nil, is the application's own schema: Up and
	// Check handle it after bmdb's, Down and Force accept its name, and
	// Versions knows its newest version. Defaults to nil: bmdb's schema
	// only (Versions still lists every application's version table, and
	// Force accepts an application's recorded version).
	Application *Application

	// HolderInfo names the caller in the migration lease, where
	// Migrator.ReadLock, bmdbctl migrate lock and the log of a migrator
	// waiting for the lease show it, e.g. "bmdbctl on host1, pid 4242; ...,
	// run by alice". At most MaxHolderInfoLength bytes of UTF-8, without NUL.
	// Defaults to the program's name, host and process id, and its build
	// (as bmdb.Config.RuntimeInfo's default).
	HolderInfo string
}

// Migrator brings a database's schemas, bmdb's and an application's, to
// the versions of its files, and administers them: versions, reverting,
// forcing a version after a repair, and the migration lease. It works on
// the pool it was made with (New), which it never closes, and detects the
// engine behind it (CockroachDB or PostgreSQL) on its first migration. A
// Migrator is safe for concurrent use, and so are Migrators of many
// processes on one database: those that change a schema take turns
// through the migration lease (package documentation).
//
// Connections: a method holds none of the pool's connections between
// calls. Reading (Check, Versions, ReadLock, ClearLock) takes one at a
// time. Migrating (Up, Down, Force) holds two at once under the lease: one
// runs golang-migrate (taken for the run and then closed, not returned to
// the pool, since its session settings are the migration's: no lock or
// idle timeout, and autocommit_before_ddl on CockroachDB), and one at a
// time renews the lease in the background. So a pool limited to a single
// connection (sql.DB.SetMaxOpenConns(1), bmdb.Config.MaxOpenConns 1) is
// refused for migrating with ErrInvalidArgument: the lease could not be
// renewed while the migration held that connection, and would expire
// under a long migration. Connections the rest of the program holds delay
// a migration, for as long as ctx allows.
//
// Every method's ctx bounds the whole call, waiting for the lease and
// migrating included: every statement runs under it, and when it ends the
// call returns an error wrapping ctx's error (how soon a statement stops
// is the pool's driver's: bmdb's cuts the connection at once). A migration
// cut short so is left dirty; the next Up runs it again if its file is
// marked "-- bmdb:rerunnable", and refuses it with a *SchemaVersionError
// saying how to repair it otherwise.
type Migrator struct {
	db         *sql.DB
	holderInfo string
	srcs       []*source // bmdb's, then the Application's

	engineMu    sync.Mutex // guards engineKnown and cockroach
	engineKnown bool       // set once the engine is detected
	cockroach   bool       // the server is CockroachDB
}

// New returns a Migrator of the database behind db, the application's
// pool (from sql.Open or sql.OpenDB of lib/pq or pgx's stdlib; bmdb.Open
// passes its own), with cfg, which may be nil. It does not connect, and
// never closes db. Its errors wrap ErrInvalidArgument and name what is
// wrong: a nil db, an invalid Config.Application (see
// Application.Validate) or files of it golang-migrate cannot read, or an
// invalid HolderInfo.
func New(db *sql.DB, cfg *Config) (*Migrator, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	switch {
	case db == nil:
		return nil, invalidArgument("New: db is nil")
	case len(cfg.HolderInfo) > MaxHolderInfoLength:
		return nil, invalidArgument("Config.HolderInfo is %d bytes long, more than %d", len(cfg.HolderInfo), MaxHolderInfoLength)
	case !utf8.ValidString(cfg.HolderInfo) || strings.ContainsRune(cfg.HolderInfo, 0):
		return nil, invalidArgument("Config.HolderInfo is not valid UTF-8 or contains NUL")
	}
	if cfg.Application != nil {
		if err := cfg.Application.Validate(); err != nil {
			return nil, fmt.Errorf("%w (Config.Application)", err)
		}
	}
	srcs, err := sources(cfg.Application)
	if err != nil {
		if cfg.Application != nil {
			return nil, invalidArgument("Config.Application %q: %v", cfg.Application.Name, err)
		}
		return nil, err
	}
	m := &Migrator{db: db, holderInfo: cfg.HolderInfo, srcs: srcs}
	if m.holderInfo == "" {
		m.holderInfo = procinfo.Describe()
	}
	return m, nil
}

// target returns m's database, detecting its engine on first use.
func (m *Migrator) target(ctx context.Context) (*target, error) {
	m.engineMu.Lock()
	defer m.engineMu.Unlock()
	if !m.engineKnown {
		cockroach, err := dbconn.IsCockroach(ctx, m.db, "")
		if err != nil {
			return nil, err
		}
		m.cockroach, m.engineKnown = cockroach, true
	}
	return &target{db: m.db, cockroach: m.cockroach}, nil
}

// Up brings bmdb's schema, then the Application's, to the newest versions
// of m's files, as bmdb.Open does: it reads the versions without any lock
// and, only if a schema is behind or dirty, takes the migration lease
// (waiting for another migrator's, for as long as ctx allows), reads
// again and migrates. A dirty version whose file is marked
// "-- bmdb:rerunnable" is forced back and run again. On CockroachDB it then
// applies that engine's own steps (docs/cockroachdb.md). It returns what
// it ran, also with an error (what ran before it).
//
// The error is a *SchemaVersionError wrapping ErrSchemaDirty for a dirty
// version it cannot run again (the error says how to repair it), and
// wrapping ErrSchemaTooNew for a schema newer than m's files that does not
// declare them compatible; a newer schema that does is left as it is. If
// ctx ends while it waits for the lease, the error names the holder.
func (m *Migrator) Up(ctx context.Context) (*Result, error) {
	return m.migrate(ctx, true)
}

// Check reports whether a binary with m's files may use the database's
// schemas as they are, without changing anything or taking any lock, as
// bmdb.Open does with bmdb.Config.SkipMigrations: each schema must be at
// the newest version of m's files, or newer with every newer migration
// declaring that version compatible. It returns nil if so, and otherwise
// a *SchemaVersionError wrapping ErrSchemaTooOld, ErrSchemaTooNew or
// ErrSchemaDirty (which says how to repair the schema) for the first
// schema that is not.
func (m *Migrator) Check(ctx context.Context) error {
	_, err := m.migrate(ctx, false)
	return err
}

// source returns m's source of schema, or an error wrapping
// ErrInvalidArgument naming what m knows.
func (m *Migrator) source(op, schema string) (*source, error) {
	for _, src := range m.srcs {
		if src.name == schema {
			return src, nil
		}
	}
	known := []string{fmt.Sprintf("%q", SchemaBmdb)}
	if len(m.srcs) > 1 {
		known = append(known, fmt.Sprintf("%q (Config.Application)", m.srcs[1].name))
	}
	return nil, invalidArgument("%s: schema %q is not one this Migrator has the files of: %s", op, schema, strings.Join(known, " or "))
}

// Down reverts the newest steps migrations (steps > 0) of schema, which is
// SchemaBmdb or the Application's name, holding the migration lease
// (waiting for it as Up does), and returns what it ran, also with an
// error. Data of what they created is lost. Revert an application's
// migrations before bmdb's that its tables reference.
//
// Errors wrap ErrInvalidArgument for a schema m has no files of, steps
// below 1, or more steps than the schema has migrations applied; a dirty
// schema, or one newer than m's files, is a *SchemaVersionError.
func (m *Migrator) Down(ctx context.Context, schema string, steps int) (*Result, error) {
	res := &Result{}
	src, err := m.source("Down", schema)
	if err != nil {
		return res, err
	}
	if steps < 1 {
		return res, invalidArgument("Down: steps is %d, must be positive", steps)
	}
	t, err := m.target(ctx)
	if err != nil {
		return res, err
	}
	err = t.locked(ctx, m.holderInfo, func() error {
		v, err := readVersion(ctx, t.db, src)
		switch {
		case err != nil:
			return err
		case v.dirty:
			return dirtyError(ctx, t.db, src, v)
		case v.version > src.latest:
			return src.versionError(v)
		}
		applied := 0
		for _, f := range src.versions {
			if f <= v.version {
				applied++
			}
		}
		if steps > applied {
			return invalidArgument("Down: steps is %d, but %s (table %s) has %d migrations applied, up to version %d", steps, src.describe(), src.table, applied, v.version)
		}
		klog.Infof("migrations: reverting %d migrations of %s from version %d", steps, src.describe(), v.version)
		res.Migrations, err = t.run(ctx, src, func(g *gomigrate.Migrate) error { return g.Steps(-steps) })
		return err
	})
	return res, err
}

// SchemaVersion is the version of one schema in a database (Versions).
type SchemaVersion struct {
	Schema   string // SchemaBmdb, or an application's name
	Table    string // its version table: schema_migrations, <name>_schema_migrations
	Database uint   // the version recorded in Table (0: none)
	Dirty    bool   // Table marks Database dirty: its migration did not finish
	Binary   uint   // the newest version of the Migrator's files (0: it has none of the schema)
	// Err is why a binary with the Migrator's files would refuse the
	// schema as it is (Check's error for it): a *SchemaVersionError, which
	// for a dirty schema says how to repair it; nil if it may use it. Of a
	// schema the Migrator has no files of, only a dirty one has an Err.
	Err error
}

// listAppTablesSQL lists the version tables of applications: their names
// end in _schema_migrations (versionTable).
const listAppTablesSQL = `SELECT table_name FROM information_schema.tables
WHERE table_schema = current_schema() AND table_name LIKE '%\_schema\_migrations' AND table_name <> 'schema_migrations'
ORDER BY table_name`

// Versions returns the version of bmdb's schema and then of every
// application's in the database, by name: the Application's, and those
// of every other version table <name>_schema_migrations, which the
// application's own binary migrated. It changes nothing and takes no
// lock. A schema that is dirty, too old or too new is not an error of
// Versions but its SchemaVersion.Err; errors are those of reaching and
// reading the database.
func (m *Migrator) Versions(ctx context.Context) ([]SchemaVersion, error) {
	srcs, err := m.allSources(ctx, m.db)
	if err != nil {
		return nil, err
	}
	var out []SchemaVersion
	for _, src := range srcs {
		v, err := readVersion(ctx, m.db, src)
		if err != nil {
			return nil, err
		}
		sv := SchemaVersion{Schema: src.name, Table: src.table, Database: v.version, Dirty: v.dirty, Binary: src.latest}
		switch {
		case v.dirty:
			sv.Err = dirtyError(ctx, m.db, src, v)
		case src.fsys != nil:
			_, sv.Err = acceptWithoutMigrating(ctx, m.db, src, v, false)
		}
		out = append(out, sv)
	}
	return out, nil
}

// allSources returns m's sources, then one for every other application
// whose version table is in db, by name.
func (m *Migrator) allSources(ctx context.Context, db *sql.DB) ([]*source, error) {
	rows, err := db.QueryContext(ctx, listAppTablesSQL)
	if err != nil {
		return nil, fmt.Errorf("migrations: listing the applications' version tables: %w", dbconn.ContextError(ctx, err))
	}
	defer rows.Close()
	apps := slices.Clone(m.srcs[1:])
	for rows.Next() {
		var table string
		if err := rows.Scan(&table); err != nil {
			return nil, fmt.Errorf("migrations: listing the applications' version tables: %w", dbconn.ContextError(ctx, err))
		}
		name := strings.TrimSuffix(table, "_schema_migrations")
		if !slices.ContainsFunc(apps, func(s *source) bool { return s.name == name }) {
			apps = append(apps, tableOnly(name))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("migrations: listing the applications' version tables: %w", dbconn.ContextError(ctx, err))
	}
	slices.SortFunc(apps, func(a, b *source) int { return strings.Compare(a.name, b.name) })
	return append([]*source{m.srcs[0]}, apps...), nil
}

// Force records version as schema's version, clean, holding the migration
// lease (waiting for it as Up does), without running any migration: the
// last step of repairing a dirty schema by hand, once the schema matches
// version (a dirty *SchemaVersionError says how to tell which version it
// matches). schema is SchemaBmdb or an application's name. It returns the
// version recorded before.
//
// version must be one m knows: 0 (no migration applied) or a version of
// m's files of the schema; of an application m has no files of, 0 or the
// version its table records (Force then only clears the dirty mark, the
// repair when the migration did take effect). Any other version, or an
// application that is neither Config.Application nor in the database, is
// refused with an error wrapping ErrInvalidArgument that lists the
// versions m knows.
func (m *Migrator) Force(ctx context.Context, schema string, version uint) (SchemaVersion, error) {
	if src, err := m.source("Force", schema); err == nil && src.fsys != nil {
		if err := src.knows(version, recorded{}); err != nil {
			return SchemaVersion{}, err // before connecting
		}
	}
	src, err := m.forceSource(ctx, m.db, schema)
	if err != nil {
		return SchemaVersion{}, err
	}
	t, err := m.target(ctx)
	if err != nil {
		return SchemaVersion{}, err
	}
	var before SchemaVersion
	err = t.locked(ctx, m.holderInfo, func() error {
		v, err := readVersion(ctx, t.db, src)
		if err != nil {
			return err
		}
		before = SchemaVersion{Schema: src.name, Table: src.table, Database: v.version, Dirty: v.dirty, Binary: src.latest}
		if err := src.knows(version, v); err != nil {
			return err
		}
		klog.Warningf("migrations: forcing %s (table %s) from version %d (dirty %v) to version %d", src.describe(), src.table, v.version, v.dirty, version)
		_, err = t.run(ctx, src, func(g *gomigrate.Migrate) error { return g.Force(forceVersion(version)) })
		return err
	})
	return before, err
}

// forceSource returns the source of schema for Force: m's, or an
// application's whose version table is in db.
func (m *Migrator) forceSource(ctx context.Context, db *sql.DB, schema string) (*source, error) {
	if src, err := m.source("Force", schema); err == nil {
		return src, nil
	}
	if !applicationName.MatchString(schema) {
		return nil, invalidArgument("Force: schema %q is neither %q nor an application's name", schema, SchemaBmdb)
	}
	srcs, err := m.allSources(ctx, db)
	if err != nil {
		return nil, err
	}
	for _, src := range srcs {
		if src.name == schema {
			return src, nil
		}
	}
	return nil, invalidArgument("Force: application %q has no version table %s in the database, and is not this Migrator's Config.Application", schema, versionTable(schema))
}

// knows checks that version is one Force may record for src at v.
func (src *source) knows(version uint, v recorded) error {
	if src.fsys == nil {
		if version != v.version && version != 0 {
			return invalidArgument("Force: version %d of %s: without its migration files (Config.Application; bmdbctl --migrations DIR) only the version its table %s records, %d, and 0 (none applied) are known",
				version, src.describe(), src.table, v.version)
		}
		return nil
	}
	if version == 0 || src.has(version) {
		return nil
	}
	return invalidArgument("Force: version %d is not one of the migrations of %s: want 0 (none applied) or one of %s", version, src.describe(), versionList(src.versions))
}

// versionList shows versions compactly: runs of consecutive versions as
// first-last.
func versionList(versions []uint) string {
	var parts []string
	for i := 0; i < len(versions); {
		j := i
		for j+1 < len(versions) && versions[j+1] == versions[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", versions[i], versions[j]))
		} else {
			parts = append(parts, fmt.Sprint(versions[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}

// ReadLock returns the migration lease of the database, or nil if no
// migrator holds one (or none ever did: no bmdb_migration_lock). It takes
// no lock; errors are those of reaching and reading the database.
func (m *Migrator) ReadLock(ctx context.Context) (*Lock, error) {
	lock, err := readMigrationLock(ctx, m.db)
	if err != nil {
		return nil, fmt.Errorf("migrations: reading the migration lock: %w", dbconn.ContextError(ctx, err))
	}
	return lock, nil
}

// ClearLock deletes the migration lease of the database, live or not, and
// a golang-migrate cockroachdb lock row (schema_lock) that a bmdb binary
// from before bmdb's own migration driver left, and reports whether there
// was anything to delete. It is an operator's override: a migrator still
// running loses its lease (it logs so when it next renews it) and another
// may start beside it. It does not wait for the lease.
func (m *Migrator) ClearLock(ctx context.Context) (bool, error) {
	lease, err := m.db.ExecContext(ctx, clearMigrationLockSQL)
	n, err := clearedRows(lease, err)
	if err != nil {
		return false, fmt.Errorf("migrations: clearing the migration lock: %w", dbconn.ContextError(ctx, err))
	}
	driverLock, err := m.db.ExecContext(ctx, clearCockroachLockSQL)
	k, err := clearedRows(driverLock, err)
	if err != nil {
		return false, fmt.Errorf("migrations: clearing golang-migrate's schema_lock: %w", dbconn.ContextError(ctx, err))
	}
	return n+k > 0, nil
}
