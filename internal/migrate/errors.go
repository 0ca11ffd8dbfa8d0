package migrate

import (
	"errors"
	"fmt"
)

// Errors of a schema a binary refuses to use, each wrapped by
// *SchemaVersionError (package bmdb re-exports them).
var (
	ErrSchemaTooNew = errors.New("bmdb: database schema is newer than this binary")
	ErrSchemaTooOld = errors.New("bmdb: database schema is older than this binary")
	ErrSchemaDirty  = errors.New("bmdb: database schema is dirty")
)

// SchemaVersionError reports a database schema this binary refuses to use.
// Err is ErrSchemaTooNew, ErrSchemaTooOld or ErrSchemaDirty.
type SchemaVersionError struct {
	Err      error
	Schema   string // "bmdb", or the Application's name
	Database uint   // the version recorded in the database (0: none)
	Binary   uint   // the newest version embedded in this binary
	Dirty    bool
	Reason   string // why a newer schema is not compatible, if known
}

func (e *SchemaVersionError) Error() string {
	what := e.Err.Error()
	if e.Schema != "" && e.Schema != BmdbSourceName {
		what += " (application " + e.Schema + ")"
	}
	if e.Dirty && e.Reason != "" {
		return fmt.Sprintf("%s: version %d is marked dirty (a migration failed half-way): %s", what, e.Database, e.Reason)
	}
	if e.Dirty {
		return fmt.Sprintf("%s: version %d is marked dirty (a migration failed half-way); repair it and force the version with golang-migrate", what, e.Database)
	}
	msg := fmt.Sprintf("%s: database at version %d, binary knows up to %d", what, e.Database, e.Binary)
	if e.Reason != "" {
		msg += " (" + e.Reason + ")"
	}
	return msg
}

// Unwrap returns Err.
func (e *SchemaVersionError) Unwrap() error { return e.Err }
