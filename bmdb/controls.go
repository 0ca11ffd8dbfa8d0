package bmdb

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"unicode"

	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/txn"
	"github.com/bmdb-dev/bmdb/internal/wait"
)

// Fleet controls: an operator pauses a process, or caps how many machines
// it works on at once, for every component of the fleet (see "Fleet
// controls" in the package doc for how the claim statement enforces them).

// MaxCap is the largest cap CapProcess takes.
const MaxCap = 10000

// A ControlChange says who changes a process's controls and why: both are
// recorded in process_control_history, with the session's RuntimeInfo.
type ControlChange struct {
	// By is who: an operator's name, or empty for the session's
	// component (Config.ComponentName). At most 128 bytes of printable UTF-8.
	By string
	// Reason is why, free text, truncated as Fail's cause is.
	Reason string
}

// validate returns an error wrapping ErrInvalidArgument if ch.By is not
// at most maxControlByLength bytes of printable UTF-8.
func (ch ControlChange) validate() error {
	if len(ch.By) > maxControlByLength || !validText(ch.By) || strings.IndexFunc(ch.By, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return invalidArgument("ControlChange.By %q: must be at most %d bytes of printable UTF-8", ch.By, maxControlByLength)
	}
	return nil
}

// The actions of process_control_history.
const (
	actionPause  = "pause"
	actionResume = "resume"
	actionCap    = "cap"
	actionUncap  = "uncap"
)

// PauseProcess pauses process fleet-wide: from the moment it returns nil,
// no claim of process commits on any component (Work returns an error
// wrapping ErrProcessPaused) until ResumeProcess. Claims held go on and end
// normally. The pause is recorded, with ch, in process_control_history. It
// reports whether the process was running (false: it was already paused,
// and nothing is recorded). process need not have claimed yet; it must
// pass ValidateProcess, and ch.By its bounds (else ErrInvalidArgument).
// On PostgreSQL its transaction waits for the claims of process in flight
// (bounded by lock_timeout, then retried). On CockroachDB a claim's read of
// the controls is a plain read, which the pause does not wait for: a claim
// that read them before the pause committed is serialized before it and
// may commit after it, until the claim's transaction ends. So there
// PauseProcess returns only after its commit plus
// Config.MaxTransactionDuration (the longest a claim's attempt runs before
// its commit) plus Config.MaxClockOffset, which every component's claims
// keep to if they use this Config's MaxTransactionDuration or less; a
// claim whose client stalled between its last check and its COMMIT can
// still commit after that, up to one SessionInterval after its check (the
// server's idle timeout). ctx bounds that wait too: if it ends meanwhile,
// the pause has committed and the error wraps ctx's. Other errors are
// Transact's.
func (s *Session) PauseProcess(ctx context.Context, process string, ch ControlChange) (changed bool, err error) {
	return s.control(ctx, process, ch, func(paused bool, cap sql.NullInt64) (bool, sql.NullInt64, string) {
		return true, cap, actionPause
	})
}

// ResumeProcess ends a pause of process (see PauseProcess): components
// claim again at their next poll. It reports whether the process was
// paused (false: it was running, and nothing is recorded).
func (s *Session) ResumeProcess(ctx context.Context, process string, ch ControlChange) (changed bool, err error) {
	return s.control(ctx, process, ch, func(paused bool, cap sql.NullInt64) (bool, sql.NullInt64, string) {
		return false, cap, actionResume
	})
}

// CapProcess caps process at n live claims fleet-wide, n in [1, MaxCap],
// or removes its cap if n is 0: from the moment it returns nil, a claim of
// process commits only if fewer than n claims of it are live, on every
// component together (Work returns an error wrapping ErrCapReached
// otherwise); on CockroachDB a new or lowered cap returns after the wait
// PauseProcess describes. Lowering the cap below the live claims lets them end
// normally; new claims start again once none holds a slot at or above the
// new cap and a slot below it is free, so that never more than n are live
// once those have ended. The change is recorded as PauseProcess's is. It
// reports whether the cap changed; n out of range is ErrInvalidArgument.
func (s *Session) CapProcess(ctx context.Context, process string, n int, ch ControlChange) (changed bool, err error) {
	if n < 0 || n > MaxCap {
		return false, invalidArgument("CapProcess: n is %d, must be in [1, %d], or 0 for no cap", n, MaxCap)
	}
	return s.control(ctx, process, ch, func(paused bool, _ sql.NullInt64) (bool, sql.NullInt64, string) {
		if n == 0 {
			return paused, sql.NullInt64{}, actionUncap
		}
		return paused, sql.NullInt64{Int64: int64(n), Valid: true}, actionCap
	})
}

// DeleteProcessControls deletes the controls row of process, and its
// claim slots, for an operator taking a process off the fleet controls
// (one that no longer runs, or a mistyped name an operator paused). This
// lifts a pause or a cap of process: from the moment it returns nil,
// claims of process commit as if it had never been controlled, and the
// next one makes a fresh controls row, running without a cap, as a
// process's first claim does. Claims held go on and end normally; its
// transaction waits for the claims of process in flight, as PauseProcess's
// does. The deletion is recorded, with ch, in process_control_history
// (action delete, with the cap the row had). It reports whether process
// had controls (false: nothing was deleted or recorded). process must pass
// ValidateProcess, and ch.By its bounds (else ErrInvalidArgument); other
// errors are Transact's. Deleting a pause or a cap is the caller's
// decision: bmdbctl and package web ask the operator to say so.
func (s *Session) DeleteProcessControls(ctx context.Context, process string, ch ControlChange) (deleted bool, err error) {
	if err := ValidateProcess(process); err != nil {
		return false, err
	}
	if err := ch.validate(); err != nil {
		return false, err
	}
	err = s.transact(ctx, txn.ReadCommitted, func(tx *Tx) error {
		deleted = false
		q := tx.t.Store()
		_, err := q.ProcessControlDelete(ctx, store.ProcessControlDeleteParams{
			Process: process, Actor: cmp.Or(ch.By, s.conn.cfg.ComponentName),
			RuntimeInfo: s.conn.cfg.RuntimeInfo, Reason: truncateCause(ch.Reason),
		})
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return nil
		case err != nil:
			return fmt.Errorf("bmdb: deleting the controls of %q: %w", process, err)
		}
		deleted = true
		if _, err := q.ProcessSlotsDelete(ctx, process); err != nil {
			return fmt.Errorf("bmdb: deleting the claim slots of %q: %w", process, err)
		}
		return nil
	})
	return deleted, err
}

// control changes the controls of process to what change returns given
// the current ones, in one session transaction, and records the change
// with action unless it changes nothing. A new cap gives the claims held
// without a slot slots of their own, so that it counts them. On
// PostgreSQL the transaction runs at READ COMMITTED: its first statement
// waits for the claims in flight, and the next ones see them
// (CockroachDB: SERIALIZABLE, which orders them).
func (s *Session) control(ctx context.Context, process string, ch ControlChange, change func(paused bool, cap sql.NullInt64) (bool, sql.NullInt64, string)) (bool, error) {
	if err := ValidateProcess(process); err != nil {
		return false, err
	}
	if err := ch.validate(); err != nil {
		return false, err
	}
	by := cmp.Or(ch.By, s.conn.cfg.ComponentName)
	reason := truncateCause(ch.Reason)
	var changed bool
	var restricts bool // the change may keep a claim that read the old controls from being allowed
	err := s.transact(ctx, txn.ReadCommitted, func(tx *Tx) error {
		q := tx.t.Store()
		cur, err := q.ProcessControlLock(ctx, process)
		if err != nil {
			return fmt.Errorf("bmdb: locking the controls of %q: %w", process, err)
		}
		paused, cap, action := change(cur.Paused, cur.ClaimCap)
		changed = paused != cur.Paused || cap != cur.ClaimCap
		restricts = paused && !cur.Paused || cap.Valid && (!cur.ClaimCap.Valid || cap.Int64 < cur.ClaimCap.Int64)
		if !changed {
			return nil
		}
		if cap.Valid {
			err := q.ProcessSlotsEnsure(ctx, store.ProcessSlotsEnsureParams{Process: process, ClaimCap: cap.Int64})
			if err != nil {
				return fmt.Errorf("bmdb: making the claim slots of %q: %w", process, err)
			}
			if _, err := q.WorkSlotsAssign(ctx, process); err != nil {
				return fmt.Errorf("bmdb: giving the claims of %q slots: %w", process, err)
			}
		}
		err = q.ProcessControlSet(ctx, store.ProcessControlSetParams{
			Process: process, Paused: paused, ClaimCap: cap, Action: action,
			Actor: by, RuntimeInfo: s.conn.cfg.RuntimeInfo, Reason: reason,
		})
		if err != nil {
			return fmt.Errorf("bmdb: changing the controls of %q: %w", process, err)
		}
		return nil
	})
	if err == nil && restricts && s.conn.engine == engineCockroach {
		err = s.waitOutClaims(ctx, process)
	}
	return changed, err
}

// waitOutClaims waits, after a change of the controls of process has
// committed on CockroachDB, until no claim that read the old controls can
// still commit (PauseProcess).
func (s *Session) waitOutClaims(ctx context.Context, process string) error {
	d := s.conn.cfg.MaxTransactionDuration
	if d < 0 {
		d = s.conn.cfg.SessionInterval // unbounded attempts: the idle timeout ends a stalled one
	}
	if err := wait.Sleep(ctx, d+s.conn.cfg.MaxClockOffset); err != nil {
		return fmt.Errorf("bmdb: the controls of %q changed, but waiting out the claims that read them before: %w", process, err)
	}
	return nil
}
