package claims

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/txn"
	"github.com/bmdb-dev/bmdb/internal/wait"
)

// resolveClaims finds out, after the COMMIT of a batch with claims was
// ambiguous, which of its claims committed (their claim ids are in the
// work table), so that no claim is left held by a live session with
// nobody working on it, and gives each call its own, or the ambiguous
// error if none of its claims did. It keeps trying while ctx and the
// session allow, and returns ambiguous (or why it could not find out) if
// none committed: then nothing of the batch did.
func (q *queue) resolveClaims(ctx context.Context, reqs []*request, ambiguous error) error {
	var all []Claim
	for _, r := range reqs {
		all = append(all, r.claim.Claims...)
	}
	if len(all) == 0 {
		return ambiguous
	}
	e := q.e
	held := map[uuid.UUID]bool{}
	for delay := txn.RetryBase; ; delay = min(2*delay, txn.RetryCap) {
		err := e.runner.Run(ctx, e.cfg.Isolation, e.lease, func(tx *txn.Tx) error {
			clear(held)
			if err := e.lease.Check(ctx, tx); err != nil {
				return err
			}
			for _, c := range all {
				w, err := tx.Store().WorkGet(ctx, store.WorkGetParams{MachineID: c.Machine, Process: q.process})
				switch {
				case isNoRows(err):
				case err != nil:
					return err
				case w.ClaimID == c.ID:
					held[c.ID] = true
				}
			}
			return nil
		})
		if err == nil {
			break
		}
		if ctx.Err() != nil || e.lease.Context().Err() != nil || wait.Sleep(ctx, delay) != nil {
			// Close, or the session's expiry, removes whatever committed.
			return fmt.Errorf("%w; then, finding out what it claimed: %w", ambiguous, err)
		}
	}
	if len(held) == 0 {
		return ambiguous
	}
	for _, r := range reqs {
		c := r.claim
		var mine []Claim
		for _, got := range c.Claims {
			if held[got.ID] {
				mine = append(mine, got)
			}
		}
		c.Claims, c.Err = mine, nil
		if len(mine) == 0 {
			c.Err = ambiguous
		}
	}
	return nil
}

func isNoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) }
