// Package migrations holds bmdb's SQL schema as golang-migrate files,
// embedded into every binary that links bmdb.
//
// Files are named NNNNNN_name.up.sql / NNNNNN_name.down.sql with fixed-width
// versions. Each up file states in its header which older binaries still work
// against the schema it creates. The same files are sqlc's schema.
//
// A migration must not fail half-way silently. PostgreSQL runs a file in
// one transaction, but CockroachDB does not: 25.x commits what precedes
// each DDL statement on its own (autocommit_before_ddl), and 23.2/24.x may
// report a multi-statement schema change committed in part (XXA00). So each
// up file is either one statement or safe to run again from any partial
// state (IF NOT EXISTS, IF EXISTS, OR REPLACE, ON CONFLICT DO NOTHING
// throughout), and says so with a line of its own:
//
//	-- bmdb:rerunnable
//
// A version left dirty by a failed run of such a file is recovered by Open
// and bmdbctl migrate up: they force the previous version and run the file
// again. A dirty version whose file lacks the marker is refused with a
// message saying what to repair. 000001 lacks it: PostgreSQL has no CREATE
// TYPE IF NOT EXISTS (and on a database that had no schema, its repair is
// to drop what it created). Application migrations follow the same rule.
package migrations

import "embed"

// FS contains every migration file at its root.
//
//go:embed *.sql
var FS embed.FS
