package txn

import (
	"errors"
	"fmt"
)

// The runner's sentinel errors, which bmdb exports under the same names
// (bmdb/errors.go documents them for callers).
var (
	ErrConnectionClosed   = errors.New("bmdb: connection closed")
	ErrRetriesExhausted   = errors.New("bmdb: transaction retries exhausted")
	ErrTransactionTooLong = errors.New("bmdb: transaction ran longer than Config.MaxTransactionDuration")
	ErrAmbiguousCommit    = errors.New("bmdb: commit outcome unknown: connection failed during COMMIT")
)

// RetriesExhaustedError reports a transaction given up after Attempts
// attempts, each failing with a serialization error or a connection failure
// before COMMIT; Last is the last of them. errors.Is(err,
// ErrRetriesExhausted) holds.
type RetriesExhaustedError struct {
	Attempts int
	Last     error
}

func (e *RetriesExhaustedError) Error() string {
	return fmt.Sprintf("%v after %d attempts: %v", ErrRetriesExhausted, e.Attempts, e.Last)
}

// Unwrap returns ErrRetriesExhausted and the last serialization error.
func (e *RetriesExhaustedError) Unwrap() []error { return []error{ErrRetriesExhausted, e.Last} }

// ErrRerun ends an attempt that found out it must run again with a new
// snapshot (a claim met a stale candidate, or made claim rows its snapshot
// cannot see): it is rolled back and run again, at once the first times,
// and not counted as a retry. Wrap it to say why.
var ErrRerun = errors.New("bmdb: transaction to run again with a new snapshot")

// ErrStaleLease means an attempt outlived the session deadline its
// snapshot saw, while later heartbeats kept the session alive: it is run
// again, with a new snapshot (a retry).
var ErrStaleLease = errors.New("bmdb: transaction outlived the session deadline it saw")
