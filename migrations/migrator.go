package migrations

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	gomigrate "github.com/golang-migrate/migrate/v4"
	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/migrationhook"
	"github.com/bmdb-dev/bmdb/internal/procinfo"
)

// Defaults and limits of Config.
const (
	// NetworkTimeoutDefault is the default Config.NetworkTimeout.
	NetworkTimeoutDefault = 10 * time.Second
	// MaxHolderInfoLength is the longest Config.HolderInfo, in bytes.
	MaxHolderInfoLength = 4096
)

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

	// NetworkTimeout bounds what no context bounds: connecting when the
	// caller's context has no deadline, and, as TCP keepalives and the TCP
	// user timeout where the platform has one, how long a connection may
	// go without the server acknowledging it. Calls are cut when their
	// context ends, whatever this says. Must not be negative. Defaults to
	// NetworkTimeoutDefault.
	NetworkTimeout time.Duration

	// WrapConnector, if not nil, wraps lib/pq's driver.Connector of each
	// pool the Migrator opens, as bmdb.Config.WrapConnector does a
	// Connection's (tests stand in for another server with it). Defaults
	// to nil.
	WrapConnector func(driver.Connector) driver.Connector
}

// Migrator brings a database's schemas, bmdb's and an application's, to
// the versions of its files, and administers them: versions, reverting,
// forcing a version after a repair, and the migration lease. Its methods
// hold no connection between calls: each opens a pool of its own on the
// DSN and closes it before it returns. A Migrator is safe for concurrent
// use, and so are Migrators of many processes on one database: those that
// change a schema take turns through the migration lease (package
// documentation).
//
// Every method's ctx bounds the whole call, connecting, waiting for the
// lease and migrating included: when it ends the call's connections are
// cut, and the call returns an error wrapping ctx's error. A migration cut
// short so is left dirty; the next Up runs it again if its file is marked
// "-- bmdb:rerunnable", and refuses it with a *SchemaVersionError saying
// how to repair it otherwise. Errors never contain the DSN's password.
type Migrator struct {
	dsn        string
	holderInfo string
	timeout    time.Duration
	srcs       []*source                               // bmdb's, then the Application's
	wrap       func(driver.Connector) driver.Connector // Config.WrapConnector
}

// New returns a Migrator of the database at dsn (a lib/pq connection
// string, as for bmdb.Config.DSN) with cfg, which may be nil. It does not
// connect. Its errors wrap ErrInvalidArgument and name what is wrong: an
// empty or malformed DSN, an invalid Config.Application (see
// Application.Validate) or files of it golang-migrate cannot read, an
// invalid HolderInfo or a negative NetworkTimeout.
func New(dsn string, cfg *Config) (*Migrator, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	switch {
	case dsn == "":
		return nil, invalidArgument("DSN is empty")
	case len(cfg.HolderInfo) > MaxHolderInfoLength:
		return nil, invalidArgument("Config.HolderInfo is %d bytes long, more than %d", len(cfg.HolderInfo), MaxHolderInfoLength)
	case !utf8.ValidString(cfg.HolderInfo) || strings.ContainsRune(cfg.HolderInfo, 0):
		return nil, invalidArgument("Config.HolderInfo is not valid UTF-8 or contains NUL")
	case cfg.NetworkTimeout < 0:
		return nil, invalidArgument("Config.NetworkTimeout is %v, must not be negative", cfg.NetworkTimeout)
	}
	if _, err := dbconn.NewConnector(dsn, time.Second, dbconn.Settings{}, nil); err != nil {
		return nil, invalidArgument("DSN is malformed: %s", strings.TrimPrefix(err.Error(), dbconn.ErrMalformedDSN.Error()+": "))
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
	m := &Migrator{dsn: dsn, holderInfo: cfg.HolderInfo, timeout: cfg.NetworkTimeout, srcs: srcs, wrap: cfg.WrapConnector}
	if m.holderInfo == "" {
		m.holderInfo = procinfo.Describe()
	}
	if m.timeout == 0 {
		m.timeout = NetworkTimeoutDefault
	}
	return m, nil
}

func init() {
	migrationhook.Open = func(ctx context.Context, m any, o migrationhook.Options) error {
		mg := m.(*Migrator)
		t := mg.target()
		t.wrap, t.cockroach = o.Wrap, o.Cockroach
		_, err := onOpen(ctx, o.DB, nil, t, mg.holderInfo, o.Apply, mg.srcs)
		return err
	}
}

// target is m's database.
func (m *Migrator) target() target {
	return target{dsn: m.dsn, networkTimeout: m.timeout, wrap: m.wrap}
}

// withPool runs fn on a migration pool of m's database.
func (m *Migrator) withPool(ctx context.Context, fn func(*migrationPool) error) error {
	return malformed(withMigrationPool(ctx, m.target(), fn))
}

// malformed makes a malformed DSN an invalid argument.
func malformed(err error) error {
	if errors.Is(err, dbconn.ErrMalformedDSN) {
		return invalidArgument("DSN is malformed: %s", strings.TrimPrefix(err.Error(), dbconn.ErrMalformedDSN.Error()+": "))
	}
	return err
}

// Up brings bmdb's schema, then the Application's, to the newest versions
// of m's files, as bmdb.Open does: it reads the versions without any lock
// and, only if a schema is behind or dirty, takes the migration lease
// (waiting for another migrator's, for as long as ctx allows), reads
// again and migrates. A dirty version whose file is marked
// "-- bmdb:rerunnable" is forced back and run again. On CockroachDB it then
// applies that engine's own steps (docs/cockroachdb.md).
//
// It returns a *SchemaVersionError wrapping ErrSchemaDirty for a dirty
// version it cannot run again (the error says how to repair it), and
// wrapping ErrSchemaTooNew for a schema newer than m's files that does not
// declare them compatible; a newer schema that does is left as it is. If
// ctx ends while it waits for the lease, the error names the holder.
func (m *Migrator) Up(ctx context.Context) error {
	return m.withPool(ctx, func(mp *migrationPool) error {
		t := m.target()
		t.cockroach = mp.cockroach
		_, err := onOpen(ctx, mp.db, mp, t, m.holderInfo, true, m.srcs)
		return err
	})
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
	return m.withPool(ctx, func(mp *migrationPool) error {
		_, err := onOpen(ctx, mp.db, mp, m.target(), m.holderInfo, false, m.srcs)
		return err
	})
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
// (waiting for it as Up does). Data of what they created is lost. Revert
// an application's migrations before bmdb's that its tables reference.
//
// Errors wrap ErrInvalidArgument for a schema m has no files of, steps
// below 1, or more steps than the schema has migrations applied; a dirty
// schema, or one newer than m's files, is a *SchemaVersionError.
func (m *Migrator) Down(ctx context.Context, schema string, steps int) error {
	src, err := m.source("Down", schema)
	if err != nil {
		return err
	}
	if steps < 1 {
		return invalidArgument("Down: steps is %d, must be positive", steps)
	}
	return m.withPool(ctx, func(mp *migrationPool) error {
		return mp.locked(ctx, m.holderInfo, func() error {
			v, err := readVersion(ctx, mp.db, src)
			switch {
			case err != nil:
				return err
			case v.dirty:
				return dirtyError(ctx, mp.db, src, v)
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
			_, err = mp.run(ctx, src, func(g *gomigrate.Migrate) error { return g.Steps(-steps) })
			return err
		})
	})
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
	var out []SchemaVersion
	err := m.withPool(ctx, func(mp *migrationPool) error {
		srcs, err := m.allSources(ctx, mp.db)
		if err != nil {
			return err
		}
		for _, src := range srcs {
			v, err := readVersion(ctx, mp.db, src)
			if err != nil {
				return err
			}
			sv := SchemaVersion{Schema: src.name, Table: src.table, Database: v.version, Dirty: v.dirty, Binary: src.latest}
			switch {
			case v.dirty:
				sv.Err = dirtyError(ctx, mp.db, src, v)
			case src.fsys != nil:
				_, sv.Err = acceptWithoutMigrating(ctx, mp.db, src, v, false)
			}
			out = append(out, sv)
		}
		return nil
	})
	return out, err
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
	var before SchemaVersion
	err := m.withPool(ctx, func(mp *migrationPool) error {
		src, err := m.forceSource(ctx, mp.db, schema)
		if err != nil {
			return err
		}
		return mp.locked(ctx, m.holderInfo, func() error {
			v, err := readVersion(ctx, mp.db, src)
			if err != nil {
				return err
			}
			before = SchemaVersion{Schema: src.name, Table: src.table, Database: v.version, Dirty: v.dirty, Binary: src.latest}
			if err := src.knows(version, v); err != nil {
				return err
			}
			klog.Warningf("migrations: forcing %s (table %s) from version %d (dirty %v) to version %d", src.describe(), src.table, v.version, v.dirty, version)
			_, err = mp.run(ctx, src, func(g *gomigrate.Migrate) error { return g.Force(forceVersion(version)) })
			return err
		})
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
	var lock *Lock
	err := m.withPool(ctx, func(mp *migrationPool) error {
		var err error
		lock, err = readMigrationLock(ctx, mp.db)
		if err != nil {
			return fmt.Errorf("migrations: reading the migration lock: %w", dbconn.ContextError(ctx, err))
		}
		return nil
	})
	return lock, err
}

// ClearLock deletes the migration lease and golang-migrate's cockroachdb
// lock row of the database, live or not, and reports whether there was
// anything to delete. It is an operator's override: a migrator still
// running loses its lease (it logs so when it next renews it) and another
// may start beside it. It does not wait for the lease.
func (m *Migrator) ClearLock(ctx context.Context) (bool, error) {
	var cleared bool
	err := m.withPool(ctx, func(mp *migrationPool) error {
		lease, err := mp.db.ExecContext(ctx, clearMigrationLockSQL)
		n, err := clearedRows(lease, err)
		if err != nil {
			return fmt.Errorf("migrations: clearing the migration lock: %w", dbconn.ContextError(ctx, err))
		}
		driverLock, err := mp.db.ExecContext(ctx, clearCockroachLockSQL)
		k, err := clearedRows(driverLock, err)
		if err != nil {
			return fmt.Errorf("migrations: clearing golang-migrate's schema_lock: %w", dbconn.ContextError(ctx, err))
		}
		cleared = n+k > 0
		return nil
	})
	return cleared, err
}
