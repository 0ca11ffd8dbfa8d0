package migrations

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Every error of this package that a caller may act on
// wraps one of these, so check them with errors.Is.
var (
	// ErrInvalidArgument is wrapped by every error about bad input: a nil
	// pool, or one too small to migrate on, an invalid Application, a
	// schema this Migrator does not know, a step count or version that
	// does not fit the schema. The message names what was wrong. It is
	// bmdb.ErrInvalidArgument too (one value under two names, so that
	// errors.Is matches across the packages), hence its "bmdb:" prefix.
	ErrInvalidArgument = errors.New("bmdb: invalid argument")

	// ErrSchemaTooNew means a schema is at a migration version newer than
	// the Migrator's files, migrated by a newer binary, and not every newer
	// migration declared the older version still compatible (in
	// bmdb_schema_compat, or bmdb_app_schema_compat for an application's).
	// It is wrapped by *SchemaVersionError.
	ErrSchemaTooNew = errors.New("migrations: database schema is newer than this binary")

	// ErrSchemaTooOld means a schema is older than the Migrator's files and
	// it was asked only to check it (Check; bmdb.Config.SkipMigrations). It
	// is wrapped by *SchemaVersionError.
	ErrSchemaTooOld = errors.New("migrations: database schema is older than this binary")

	// ErrSchemaDirty means a migration did not finish (it failed, or its
	// client was cut off) and its file is not marked safe to run again:
	// the schema needs an operator's repair, which the error describes
	// (see SchemaVersionError). It is wrapped by *SchemaVersionError.
	ErrSchemaDirty = errors.New("migrations: database schema is dirty")
)

// invalidArgument returns an error wrapping ErrInvalidArgument.
func invalidArgument(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// SchemaVersionError reports a schema that a binary must not use as it
// is: Err is ErrSchemaTooNew, ErrSchemaTooOld or ErrSchemaDirty.
//
// For a dirty schema it also says how to repair it: which migration file
// did not finish, what that file creates and which of those objects exist
// now (so an operator can tell whether the schema matches the version
// before the file or the file's own, for instance when the server finished
// a migration whose client was cut off), and the command that forces the
// matching version (bmdbctl migrate force, or Migrator.Force).
type SchemaVersionError struct {
	Err      error
	Schema   string // SchemaBmdb, or the Application's name
	Table    string // the schema's version table, e.g. schema_migrations
	Database uint   // the version recorded in Table (0: none)
	Binary   uint   // the newest version among the Migrator's files (0: it has none of the schema)
	Dirty    bool   // Table marks Database dirty: its migration did not finish
	Reason   string // why a newer schema is not compatible, if known

	// File is the up file of the dirty version, if the Migrator has it.
	File string
	// Previous is the version before the dirty one (0: none): the schema
	// matches it if nothing of File took effect.
	Previous uint
	// Rerunnable says that File is marked "-- bmdb:rerunnable": a
	// migrating Open or Migrator.Up runs it again by itself, so this error
	// comes only from a check (Migrator.Check, bmdb.Config.SkipMigrations).
	Rerunnable bool
	// Objects lists what File creates (tables, views, indexes, types,
	// sequences, columns), each with whether it exists now; nil when File
	// is unknown.
	Objects []SchemaObject
}

// SchemaObject is an object a migration file creates.
type SchemaObject struct {
	Kind   string // "table", "view", "index", "type", "sequence" or "column"
	Name   string // as the file spells it; a column is "table.column"
	Exists bool   // found in the database's current schema
}

func (e *SchemaVersionError) Error() string {
	what := e.Err.Error()
	if e.Schema != "" && e.Schema != SchemaBmdb {
		what += " (application " + e.Schema + ")"
	}
	if e.Dirty {
		return what + ": " + e.dirtyText()
	}
	msg := fmt.Sprintf("%s: database at version %d, binary knows up to %d", what, e.Database, e.Binary)
	if e.Reason != "" {
		msg += " (" + e.Reason + ")"
	}
	return msg
}

// forceCommand is the bmdbctl command that forces e's schema to version
// (for an application, bmdbctl needs its files, DIR, to know a version
// other than the recorded one).
func (e *SchemaVersionError) forceCommand(version uint) string {
	cmd := fmt.Sprintf("bmdbctl migrate force %d", version)
	if e.Schema != "" && e.Schema != SchemaBmdb {
		cmd += " --app " + e.Schema
		if version != e.Database && version != 0 {
			// bmdbctl knows an application's other versions from its files.
			cmd += " --migrations DIR"
		}
	}
	return cmd
}

// dirtyText explains a dirty version and how to repair it.
func (e *SchemaVersionError) dirtyText() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s records version %d as dirty: its migration did not finish (it failed, or its client was cut off)", e.tableName(), e.Database)
	switch {
	case e.File == "":
		if e.Binary == 0 {
			b.WriteString("; this binary does not have the schema's migration files, so it cannot tell what the migration creates: " +
				"the application's own binary (its Open), or bmdbctl with --migrations DIR, lists it and what exists")
		} else {
			fmt.Fprintf(&b, "; this binary's migration files go up to version %d and do not include it, so it cannot tell what the migration creates: "+
				"a binary that has its file lists it and what exists", e.Binary)
		}
		fmt.Fprintf(&b, ". Make the schema match version %d (the migration took effect: a server may finish a migration whose client was cut off) "+
			"or the version before it, then force that version (%s, or Migrator.Force)", e.Database, e.forceCommand(e.Database))
		return b.String()
	case e.Rerunnable:
		fmt.Fprintf(&b, "; its file %s is marked %q, so a migrating Open (without Config.SkipMigrations), Migrator.Up or bmdbctl migrate up runs it again", e.File, rerunnableMarker)
		return b.String()
	}
	fmt.Fprintf(&b, ", and its file %s is not marked %q, so it may have taken effect in part, or in full (a server may finish a migration whose client was cut off)", e.File, rerunnableMarker)
	var there, missing []string
	for _, o := range e.Objects {
		if o.Exists {
			there = append(there, o.Kind+" "+o.Name)
		} else {
			missing = append(missing, o.Kind+" "+o.Name)
		}
	}
	switch {
	case len(e.Objects) == 0:
		fmt.Fprintf(&b, ". It creates no table, view, index, type, sequence or column to look for: compare its statements with the schema. "+
			"If they took effect, the schema matches version %d: run %s; if not, it matches version %d: run %s",
			e.Database, e.forceCommand(e.Database), e.Previous, e.forceCommand(e.Previous))
	case len(missing) == 0:
		fmt.Fprintf(&b, ". Everything it creates exists (%s): the schema matches version %d, unless another statement of the file did not take effect; "+
			"check them, then run %s", strings.Join(there, ", "), e.Database, e.forceCommand(e.Database))
	case len(there) == 0:
		fmt.Fprintf(&b, ". Nothing it creates exists (%s): the schema matches version %d, unless another statement of the file took effect; "+
			"check them, then run %s", strings.Join(missing, ", "), e.Previous, e.forceCommand(e.Previous))
	default:
		fmt.Fprintf(&b, ". Of what it creates, these exist: %s; these do not: %s. It took effect in part: finish it by hand and run %s, "+
			"or drop what it created and run %s",
			strings.Join(there, ", "), strings.Join(missing, ", "), e.forceCommand(e.Database), e.forceCommand(e.Previous))
	}
	b.WriteString("; then Open or bmdbctl migrate up migrates on")
	return b.String()
}

// tableName is e.Table, or a description of it if unknown.
func (e *SchemaVersionError) tableName() string {
	if e.Table != "" {
		return "table " + e.Table
	}
	return "its version table"
}

// Unwrap returns Err.
func (e *SchemaVersionError) Unwrap() error { return e.Err }
