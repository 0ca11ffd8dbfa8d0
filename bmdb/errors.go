package bmdb

import (
	"errors"
	"fmt"
	"strings"

	"github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/internal/claims"
	"github.com/bmdb-dev/bmdb/internal/lease"
	"github.com/bmdb-dev/bmdb/internal/txn"
	"github.com/bmdb-dev/bmdb/migrations"
)

// Sentinel errors. Every error bmdb returns that callers may want to act on
// wraps one of these (or is a typed error whose Is method matches one), so
// check them with errors.Is. Most are defined by the internal room that
// returns them (the transaction runner, the lease, the batch engine) and
// are exported here, the same values.
var (
	// ErrInvalidArgument is wrapped by every error about bad input: an empty
	// or over-long name, a non-positive interval, a nil callback, a malformed
	// DSN. The message names the offending argument or Config field. It is
	// migrations.ErrInvalidArgument, one value under two names: an Open
	// refused by package migrations matches either.
	ErrInvalidArgument = migrations.ErrInvalidArgument

	// ErrConnectionClosed is returned by methods of a Connection after Close.
	ErrConnectionClosed = txn.ErrConnectionClosed

	// ErrSessionExpired means the session is no longer alive: its deadline
	// passed on the database clock, or its heartbeat could not extend it for
	// a whole interval. Nothing of a transaction that returns it committed.
	ErrSessionExpired = lease.ErrSessionExpired

	// ErrSessionClosed is returned by methods of a Session after Close.
	ErrSessionClosed = lease.ErrSessionClosed

	// ErrWorkConflict means every candidate the retrieval returned is claimed
	// for the process by another live session.
	ErrWorkConflict = claims.ErrWorkConflict

	// ErrNothingToDo means the retrieval returned no candidate, or only
	// candidates that are in backoff for the process.
	ErrNothingToDo = claims.ErrNothingToDo

	// ErrProcessPaused means the process is paused fleet-wide
	// (Session.PauseProcess): Work claims nothing until it is resumed.
	// It wraps ErrNothingToDo, so that code that waits on that waits on a
	// pause too; check it first to tell the two apart.
	ErrProcessPaused = claims.ErrProcessPaused

	// ErrCapReached means the process has as many live claims as its cap
	// allows (Session.CapProcess), fleet-wide: Work claims nothing until one
	// ends. It wraps ErrNothingToDo, as ErrProcessPaused does.
	ErrCapReached = claims.ErrCapReached

	// ErrWorkDone is returned by Finish, Cancel and Fail once the Work has
	// ended.
	ErrWorkDone = errors.New("bmdb: work already ended")

	// ErrWorkLost means the session no longer holds the claim: it was taken
	// over after the session expired, or removed with the session. The
	// Finish, Cancel or Fail that returns it did not take effect.
	ErrWorkLost = claims.ErrWorkLost

	// ErrUnknownMachine means a retrieval returned a machine id that is not
	// in the machines table.
	ErrUnknownMachine = claims.ErrUnknownMachine

	// ErrNoBackoff means ClearBackoff found no backoff to clear.
	ErrNoBackoff = errors.New("bmdb: no backoff")

	// ErrRetriesExhausted means a transaction kept failing with retryable
	// errors (serialization failures, or a connection that failed before
	// COMMIT); it is wrapped by *RetriesExhaustedError.
	ErrRetriesExhausted = txn.ErrRetriesExhausted

	// ErrTransactionTooLong means a transaction attempt on CockroachDB ran
	// longer than Config.MaxTransactionDuration before its commit: it was
	// rolled back, nothing of it committed, and it was not retried, since
	// an attempt as long would likely fail its read refresh (see
	// Config.MaxTransactionDuration). Shorten the callback: retrieve fewer
	// candidates, do slow work outside the transaction.
	ErrTransactionTooLong = txn.ErrTransactionTooLong

	// ErrAmbiguousCommit means the connection failed while COMMIT was in
	// flight: the transaction may or may not have committed. bmdb does not
	// retry it. For a Work, the claim tells: a later Cancel either succeeds
	// (nothing committed) or returns ErrWorkLost.
	ErrAmbiguousCommit = txn.ErrAmbiguousCommit
)

// RetriesExhaustedError reports a transaction given up after Attempts
// attempts, each failing with a serialization error or a connection failure
// before COMMIT; Last is the last of them. errors.Is(err,
// ErrRetriesExhausted) holds.
type RetriesExhaustedError = txn.RetriesExhaustedError

// withConnectHint adds to a failed first connection what to change in the
// DSN, for the failures whose fix is known: lib/pq asks for TLS unless the
// DSN says sslmode=disable, which a local test server does not offer.
func withConnectHint(err error) error {
	if errors.Is(err, pq.ErrSSLNotSupported) {
		return fmt.Errorf("%w (the server does not offer TLS: add sslmode=disable to the DSN, e.g. postgres://user@host:5432/db?sslmode=disable, if an unencrypted connection is intended)", err)
	}
	return err
}

// IsPermanent reports whether err carries a database error that no retry
// can fix because the statement itself cannot run, whatever the data:
// SQLSTATE class 42, syntax error or access rule violation (undefined
// table 42P01, undefined column 42703, syntax error 42601, insufficient
// privilege 42501, datatype mismatch 42804, undefined function 42883, ...),
// and class 0A, feature not supported (a statement the engine does not
// run). A component that meets one should stop and say so rather than
// retry: worker.Loop.Run returns it.
//
// Data exceptions (class 22: a value too long, a bad cast of one row's
// text) are not permanent by this rule: they depend on the rows a
// statement meets, so they fail the one machine whose data caused them
// (with backoff) instead of stopping a whole fleet.
func IsPermanent(err error) bool {
	code := sqlState(err)
	return strings.HasPrefix(code, "42") || strings.HasPrefix(code, "0A")
}

// invalidArgument returns an error wrapping ErrInvalidArgument.
func invalidArgument(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}
