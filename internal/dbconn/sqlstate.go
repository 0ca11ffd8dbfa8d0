package dbconn

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/lib/pq"
)

// PostgreSQL / CockroachDB error codes the wrapper and bmdb react to.
const (
	CodeSerializationFailure = "40001"
	CodeDeadlockDetected     = "40P01"
	CodeLockNotAvailable     = "55P03" // lock_timeout passed

	CodeUniqueViolation     = "23505"
	CodeForeignKeyViolation = "23503"
	CodeUndefinedTable      = "42P01"
	// CockroachDB: the statement may or may not have committed.
	CodeStatementCompletionUnknown = "40003"

	codeUndefinedVar = "42704" // a setting this server does not have
)

// SQLState returns the SQLSTATE of the first database error in err's chain,
// or "".
func SQLState(err error) string {
	var pqErr *pq.Error
	if errors.As(err, &pqErr) {
		return string(pqErr.Code)
	}
	return ""
}

// ContextError adds ctx's cause to err when ctx is done, so that a query
// aborted by cancellation reads and matches (errors.Is) as what it is.
func ContextError(ctx context.Context, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	cause := context.Cause(ctx)
	if errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w: %w", cause, err)
}

// IsRetryable reports whether err is a serialization failure (or a lock
// wait given up) after which the transaction may be retried.
func IsRetryable(err error) bool {
	switch SQLState(err) {
	case CodeSerializationFailure, CodeDeadlockDetected, CodeLockNotAvailable:
		return true
	}
	return false
}

// versionSQL asks the server for its version.
const versionSQL = "SELECT version()"

// IsCockroach tells CockroachDB from PostgreSQL by SELECT version(). Its
// errors name the server by dsn, without its password; "" (a pool whose
// DSN the caller does not know) names none.
func IsCockroach(ctx context.Context, db *sql.DB, dsn string) (bool, error) {
	var version string
	if err := db.QueryRowContext(ctx, versionSQL).Scan(&version); err != nil {
		if dsn == "" {
			return false, fmt.Errorf("bmdb: detecting database engine: %w", ContextError(ctx, err))
		}
		return false, fmt.Errorf("bmdb: detecting database engine at %s: %w", RedactDSN(dsn), RedactError(ContextError(ctx, err), dsn))
	}
	return strings.Contains(version, "CockroachDB"), nil
}
