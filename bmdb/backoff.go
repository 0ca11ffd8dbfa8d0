package bmdb

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/txn"
)

// Backoff says how long a failed (machine, process) is kept from being
// claimed again. The first failure waits Initial; each further failure waits
// the previous interval times Exponent, capped at Maximum. The interval is
// remembered per (machine, process) until a Finish clears it, so it keeps
// growing across sessions and components. Deadlines are on the database
// clock.
type Backoff struct {
	// Initial is the first interval. Must be positive.
	Initial time.Duration
	// Maximum caps the interval. Must be at least Initial.
	Maximum time.Duration
	// Exponent multiplies the interval at each failure. Must be at least 1
	// (1 keeps it constant).
	Exponent float64
	// Jitter, in [0, 1], shortens each wait by a random fraction of up to
	// Jitter, so that machines that failed together do not return together.
	// The remembered interval is not jittered. Defaults to 0.
	Jitter float64
}

// Validate returns an error wrapping ErrInvalidArgument that names the
// first invalid field of b, or nil.
func (b Backoff) Validate() error {
	switch {
	case b.Initial <= 0:
		return invalidArgument("Backoff.Initial is %v, must be positive", b.Initial)
	case b.Maximum < b.Initial:
		return invalidArgument("Backoff.Maximum is %v, must be at least Backoff.Initial (%v)", b.Maximum, b.Initial)
	case !(b.Exponent >= 1) || math.IsInf(b.Exponent, 0):
		return invalidArgument("Backoff.Exponent is %v, must be a finite number of at least 1", b.Exponent)
	case !(b.Jitter >= 0 && b.Jitter <= 1):
		return invalidArgument("Backoff.Jitter is %v, must be in [0, 1]", b.Jitter)
	}
	return nil
}

// backoffPolicy is a Backoff as the batch engine computes with it.
type backoffPolicy struct{ b Backoff }

// Next returns the interval that follows prev (0: no previous failure).
func (p backoffPolicy) Next(prev time.Duration) time.Duration {
	b := p.b
	if prev <= 0 {
		return b.Initial
	}
	n := float64(prev) * b.Exponent
	if n >= float64(b.Maximum) {
		return b.Maximum
	}
	return max(time.Duration(n), b.Initial)
}

// Wait returns the jittered wait for interval d, given u uniform in [0, 1).
func (p backoffPolicy) Wait(d time.Duration, u float64) time.Duration {
	return d - time.Duration(float64(d)*p.b.Jitter*u)
}

// ClearBackoff is an operator's override: it deletes the backoff of
// (machine, process), so that the machine may be claimed at once and its next
// failure starts again from Backoff.Initial, and records BackoffCleared with
// reason in work_history under this session. It returns an error wrapping
// ErrNoBackoff if there is none (expired backoffs count: their interval is
// still remembered), and the errors of Transact.
func (s *Session) ClearBackoff(ctx context.Context, machine uuid.UUID, process, reason string) error {
	if err := ValidateProcess(process); err != nil {
		return err
	}
	reason = truncateCause(reason)
	err := s.transact(ctx, txn.Serializable, func(tx *Tx) error {
		q := tx.t.Store()
		n, err := q.WorkBackoffDelete(ctx, store.WorkBackoffDeleteParams{MachineID: machine, Process: process})
		if err != nil {
			return fmt.Errorf("bmdb: clearing backoff of %q on %s: %w", process, machine, err)
		}
		if n == 0 {
			return fmt.Errorf("%w: %q on %s", ErrNoBackoff, process, machine)
		}
		err = q.WorkHistoryInsert(ctx, store.WorkHistoryInsertParams{
			MachineID:     machine,
			Process:       process,
			SessionID:     s.ID(),
			Event:         store.WorkHistoryEventBackoffCleared,
			FailedCause:   sql.NullString{String: reason, Valid: reason != ""},
			ComponentName: sql.NullString{String: s.conn.cfg.ComponentName, Valid: true},
		})
		if err != nil {
			return fmt.Errorf("bmdb: recording cleared backoff: %w", err)
		}
		return nil
	})
	if err == nil {
		s.conn.counters.Event(process, store.WorkHistoryEventBackoffCleared)
	}
	return err
}
