package migrations

import "time"

// Result is what Migrator.Up or Migrator.Down ran, in the order it ran.
// It is never nil: after an error it holds what ran before the error.
type Result struct {
	// Migrations are the migration files that ran to completion: bmdb's,
	// then the application's. Empty if every schema was already where the
	// call would bring it.
	Migrations []Migration
	// CockroachSteps name the steps of CockroachDB's own that Up applied
	// after bmdb's migrations (see docs/cockroachdb.md), e.g.
	// "work_history.id DEFAULT unordered_unique_rowid()"; empty on
	// PostgreSQL, and once they are in place.
	CockroachSteps []string
}

// Migration is one migration file that ran.
type Migration struct {
	Schema    string        // SchemaBmdb, or the application's name
	Version   uint          // the version it applied (up) or reverted (down)
	Name      string        // its file, e.g. "000015_fleet_controls.up.sql"
	Direction Direction     // DirectionUp or DirectionDown
	Duration  time.Duration // from its dirty mark to its clean mark
}

// Direction is which way a migration ran.
type Direction string

// Directions of a Migration.
const (
	DirectionUp   Direction = "up"
	DirectionDown Direction = "down"
)
