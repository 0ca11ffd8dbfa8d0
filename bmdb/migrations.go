package bmdb

import (
	"context"
	"errors"

	"github.com/bmdb-dev/bmdb/internal/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/migrate"
)

// Schemas are migrated by package internal/migrate: bmdb's own migrations
// (package migrations), then the application's, if Config.Application
// names one, under a migration lease of their own. These are Open's and
// the operators' entries into it.

// bmdbSourceName names bmdb's own migrations.
const bmdbSourceName = migrate.BmdbSourceName

// migrateOnOpen brings every source of c to its version (apply), or checks
// that it is usable as it is.
func migrateOnOpen(ctx context.Context, c *Connection, apply bool) error {
	var srcs []*migrate.Source
	var err error
	if app := c.cfg.Application; app != nil {
		srcs, err = migrate.Sources(app.Name, app.Migrations)
	} else {
		srcs, err = migrate.Sources("", nil)
	}
	if err != nil {
		return err
	}
	info := c.cfg.ComponentName
	if c.cfg.RuntimeInfo != "" {
		info += " (" + c.cfg.RuntimeInfo + ")"
	}
	t := migrate.Target{DSN: c.cfg.DSN, NetworkTimeout: c.cfg.NetworkTimeout, Mode: migrationMode(c.cfg.mode()), Cockroach: !c.onPostgres}
	return migrate.OnOpen(ctx, c.db, t, truncateCause(info), apply, srcs)
}

// adminTarget is the database at dsn for an operator's call, in cockroach
// mode if the process is.
func adminTarget(dsn string) (migrate.Target, error) {
	if dsn == "" {
		return migrate.Target{}, invalidArgument("DSN is empty")
	}
	return migrate.Target{DSN: dsn, NetworkTimeout: 2 * SessionIntervalDefault, Mode: migrationMode(crdbmode.Get())}, nil
}

// migrationMode is the part of cockroach mode that applies to migrating.
func migrationMode(s crdbmode.Settings) crdbmode.Settings {
	return crdbmode.Settings{Enabled: s.Enabled, Seed: s.Seed, MigrationFailAfter: s.MigrationFailAfter}
}

// adminError makes a malformed DSN an invalid argument.
func adminError(err error) error {
	if errors.Is(err, dbconn.ErrMalformedDSN) {
		return malformedDSN(err)
	}
	return err
}

// MigrateUp applies every embedded migration the database at dsn lacks, as
// Open does (waiting for the migration lock). It returns a
// *SchemaVersionError for a dirty or too new schema.
func MigrateUp(ctx context.Context, dsn string) error {
	t, err := adminTarget(dsn)
	if err != nil {
		return err
	}
	return adminError(migrate.Up(ctx, t, "bmdb.MigrateUp"))
}

// MigrateDown reverts the newest steps migrations (steps > 0) of the
// database at dsn, holding the migration lock. Data of what they created is
// lost.
func MigrateDown(ctx context.Context, dsn string, steps int) error {
	if steps <= 0 {
		return invalidArgument("MigrateDown: steps is %d, must be positive", steps)
	}
	t, err := adminTarget(dsn)
	if err != nil {
		return err
	}
	err = migrate.Down(ctx, t, "bmdb.MigrateDown", steps)
	if errors.Is(err, migrate.ErrTooManySteps) {
		return invalidArgument("MigrateDown: %v", err)
	}
	return adminError(err)
}

// SchemaInfo describes a database's schema version against this binary's.
type SchemaInfo struct {
	Database uint // the version recorded in the database (0: none)
	Binary   uint // the newest version embedded in this binary
	Dirty    bool // a migration failed half-way
}

// ReadSchemaInfo returns the schema version of the database at dsn and this
// binary's, without changing anything and without taking any lock.
func ReadSchemaInfo(ctx context.Context, dsn string) (SchemaInfo, error) {
	t, err := adminTarget(dsn)
	if err != nil {
		return SchemaInfo{}, err
	}
	info, err := migrate.ReadInfo(ctx, t)
	return SchemaInfo(info), adminError(err)
}

// MigrationLock describes the lease of the component migrating the schema
// (ReadMigrationLock).
type MigrationLock = migrate.Lock

// ReadMigrationLock returns the migration lease of the database at dsn, or
// nil if no migrator holds one. It takes no lock.
func ReadMigrationLock(ctx context.Context, dsn string) (*MigrationLock, error) {
	t, err := adminTarget(dsn)
	if err != nil {
		return nil, err
	}
	lock, err := migrate.ReadLock(ctx, t)
	return lock, adminError(err)
}

// ClearMigrationLock deletes the migration lease and golang-migrate's
// cockroachdb lock row of the database at dsn, live or not, and reports
// whether there was anything to delete. It is an operator's override: a
// migrator still running loses its lock and another may start beside it.
func ClearMigrationLock(ctx context.Context, dsn string) (bool, error) {
	t, err := adminTarget(dsn)
	if err != nil {
		return false, err
	}
	cleared, err := migrate.ClearLock(ctx, t)
	return cleared, adminError(err)
}
