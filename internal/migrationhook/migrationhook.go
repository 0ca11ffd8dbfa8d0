// Package migrationhook is the door between package bmdb's Open and
// package migrations for what only this module may pass and what package
// migrations does not show in its API: the Connection's pool (the version
// reads use it, so that an Open that finds its schema current opens no
// other connection), the engine Open detected, and the Connection's
// connector wrapper (bmdb.Config.WrapConnector).
//
// Package migrations sets Open when it is initialized; package bmdb, which
// imports package migrations, calls it.
package migrationhook

import (
	"context"
	"database/sql"
	"database/sql/driver"
)

// Options are what bmdb.Open passes beside its *migrations.Migrator.
type Options struct {
	// DB is the Connection's pool: the lock-free version reads run on it.
	DB *sql.DB
	// Wrap is the Connection's bmdb.Config.WrapConnector, for the
	// migration pool.
	Wrap func(driver.Connector) driver.Connector
	// Cockroach says that the server is CockroachDB.
	Cockroach bool
	// Apply migrates; false only checks (bmdb.Config.SkipMigrations).
	Apply bool
}

// Open is Migrator.Up (o.Apply) or Migrator.Check of m, a
// *migrations.Migrator, with o. Set by package migrations.
var Open func(ctx context.Context, m any, o Options) error
