// Package migrations is bmdb's migration room: bmdb's SQL schema as
// golang-migrate files, embedded into every binary that links bmdb (FS,
// Schema), an application's own schema on top of it (Application), and
// the Migrator that brings a database to both and administers them.
// bmdb.Open uses it on its Connection's pool (migrating, or only checking
// with Config.SkipMigrations), and so does bmdbctl migrate; an
// application's own tooling can too, on the pool it already has:
//
//	db, err := sql.Open("postgres", dsn) // the application's pool
//	m, err := migrations.New(db, &migrations.Config{Application: app, HolderInfo: "deploy job 42"})
//	if err != nil {
//		// a nil db or a bad Application: errors.Is(err, migrations.ErrInvalidArgument)
//	}
//	res, err := m.Up(ctx) // bmdb's schema, then the application's
//	for _, r := range res.Migrations {
//		log.Printf("ran %s (%s) in %v", r.Name, r.Schema, r.Duration)
//	}
//
// A Migrator holds two of the pool's connections while it migrates (see
// Migrator): a pool limited to one is refused.
//
// # Files
//
// Files are named NNNNNN_name.up.sql / NNNNNN_name.down.sql with fixed-width
// versions. Each up file states in its header which older binaries still work
// against the schema it creates. The same files are sqlc's schema.
//
// # Versions, and the lease
//
// Each schema records its version in a table of its own, as golang-migrate
// does: bmdb's in schema_migrations, an application's in
// <name>_schema_migrations, numbered independently. Reading them takes no
// lock, so any number of components open a database at once; only one
// that finds a schema behind (or dirty) takes the migration lease, a row of
// bmdb_migration_lock on the database clock that its holder renews while
// it migrates and deletes when done, and that expires by itself if the
// holder dies (Migrator.ReadLock and ClearLock; bmdbctl migrate lock and
// unlock). Neither engine's own lock is relied upon.
//
// # Rolling upgrades
//
// A schema newer than a binary's files is used as it is if every newer
// migration declared the binary's version still compatible, in
// bmdb_schema_compat (bmdb's) or bmdb_app_schema_compat (an
// application's), and refused with ErrSchemaTooNew otherwise.
//
// # How a file runs
//
// PostgreSQL runs a file in one Exec: one implicit transaction, so all of
// it takes effect or none. CockroachDB gets each statement of a file in an
// Exec of its own, each its own implicit transaction (driver.go), with
// autocommit_before_ddl on where the version has it, and so does an
// application's file: a whole file in one Exec is one transaction on
// CockroachDB 23.2 and 24.x, and on 25.x where a role turned
// autocommit_before_ddl off, and CockroachDB refuses there a schema change
// that builds on an earlier one of the same transaction. bmdb's 000015
// adds work.slot and a partial index WHERE slot IS NOT NULL: "cannot
// create partial index on column ... which is not public", 0A000
// (cockroach#83593, open); 000014's down file (and its up file, run
// again) drops a constraint and adds it back under the same name:
// "duplicate constraint name", 42710 (cockroach#55184). Sent whole, such a
// file failed, its version stayed dirty, running it again failed the same
// way, and Open never got past it. Sent statement by statement, it applies
// on every version, an application's partial index on a column it adds
// included. What was read and what was run: the two refusals and the
// versions with autocommit_before_ddl (added in 24.1, on by default from
// 25.1) are from CockroachDB's issues and documentation; cockroach mode
// (internal/testing/crdbmode) emulates them per version, and the tests
// migrate there on 23.2, 24.x and 25.x with the setting off, up, down to
// 000013 and up again; no real cluster ran them here.
//
// # Dirty versions
//
// A migration must not fail half-way silently. On CockroachDB a file
// stopped between two statements (a statement failed, its node drained)
// has the statements before it applied; and on either engine a migrator
// killed or cut off in a migration leaves its version dirty, whether or
// not the server finished the file after its client was gone. So each up
// file is either one statement or safe to run again from any partial
// state (IF NOT EXISTS, IF EXISTS, OR REPLACE, ON CONFLICT DO NOTHING
// throughout), and says so with a line of its own:
//
//	-- bmdb:rerunnable
//
// A version left dirty by a file so marked is recovered by Open,
// Migrator.Up and bmdbctl migrate up: they force the previous version and
// run the file again. A dirty version whose file lacks the marker is
// refused with a *SchemaVersionError that names the version table, lists
// what the file creates and which of it exists now, and says which
// version that means the schema matches; once it matches one,
// Migrator.Force (bmdbctl migrate force VERSION [--app NAME]) records it.
// Every file of bmdb's carries the marker, 000001 included, whose CREATE
// TYPE bmdb runs in each engine's idempotent form (types.go), so a migrating
// Open never refuses bmdb's schema as dirty. Application migrations follow
// the same rules; their files run as written (no CREATE TYPE rewriting).
package migrations

import (
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"
)

// FS contains every migration file at its root.
//
//go:embed *.sql
var FS embed.FS

// upFile is the name of an up migration: a fixed-width version, a title.
var upFile = regexp.MustCompile(`^([0-9]+)_[A-Za-z0-9_]+\.up\.sql$`)

// Schema returns bmdb's schema as one SQL text: every up migration, in
// version order, each under a comment naming its file. It is what an
// application's sqlc configuration lists before the application's own
// migrations, so that its queries can use bmdb's tables (foreign keys
// to machines, joins with work and work_backoff): an application whose
// go.mod lists cmd/bmdb-schema as a tool writes it to a file it commits
// with
//
//	go tool bmdb-schema > bmdb_schema.sql
//
// and checks in CI that the committed file is current (see the README's
// "Your own pipeline"). The text depends only on the migrations embedded
// in this version of bmdb.
func Schema() (string, error) {
	entries, err := fs.ReadDir(FS, ".")
	if err != nil {
		return "", fmt.Errorf("migrations: reading the embedded files: %w", err)
	}
	var names []string
	for _, e := range entries {
		if upFile.MatchString(e.Name()) {
			names = append(names, e.Name())
		}
	}
	// Fixed-width versions: the names sort in version order.
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("-- bmdb's schema: its up migrations, in order, for an application's sqlc.\n")
	b.WriteString("-- Generated by bmdb-schema (go tool bmdb-schema); do not edit.\n")
	for _, name := range names {
		text, err := fs.ReadFile(FS, name)
		if err != nil {
			return "", fmt.Errorf("migrations: reading %s: %w", name, err)
		}
		fmt.Fprintf(&b, "\n-- migrations/%s\n", name)
		b.Write(text)
		if len(text) > 0 && text[len(text)-1] != '\n' {
			b.WriteByte('\n')
		}
	}
	return b.String(), nil
}
