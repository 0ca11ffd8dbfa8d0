package bmdb

import (
	"context"
	"database/sql/driver"
	"strings"
	"time"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
)

// bmdb reaches the database through its driver wrapper, package
// internal/dbconn; these are the names it uses of it.

type (
	connector    = dbconn.Connector
	connSettings = dbconn.Settings
)

// Error codes bmdb reacts to (dbconn.Code*).
const (
	codeSerializationFailure       = dbconn.CodeSerializationFailure
	codeDeadlockDetected           = dbconn.CodeDeadlockDetected
	codeLockNotAvailable           = dbconn.CodeLockNotAvailable
	codeForeignKeyViolation        = dbconn.CodeForeignKeyViolation
	codeStatementCompletionUnknown = dbconn.CodeStatementCompletionUnknown
)

// newConnector is dbconn.NewConnector, whose malformed DSN is an invalid
// argument.
func newConnector(dsn string, networkTimeout time.Duration, settings connSettings, wrap func(driver.Connector) driver.Connector) (*connector, error) {
	c, err := dbconn.NewConnector(dsn, networkTimeout, settings, wrap)
	if err != nil {
		return nil, malformedDSN(err)
	}
	return c, nil
}

// malformedDSN restates dbconn's ErrMalformedDSN as an invalid
// Config.DSN (bmdbctl restates that in terms of its flags).
func malformedDSN(err error) error {
	return invalidArgument("Config.DSN is malformed: %s", strings.TrimPrefix(err.Error(), dbconn.ErrMalformedDSN.Error()+": "))
}

func sqlState(err error) string                         { return dbconn.SQLState(err) }
func contextError(ctx context.Context, err error) error { return dbconn.ContextError(ctx, err) }
func redactDSN(dsn string) string                       { return dbconn.RedactDSN(dsn) }
func redactError(err error, dsn string) error           { return dbconn.RedactError(err, dsn) }
