package claims

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/txn"
	"github.com/bmdb-dev/bmdb/internal/wait"
)

// A claim statement needs two kinds of rows that no claim transaction
// makes: a pair's claim row (work_fencing), which a claim locks and claims
// through, and a process's controls row (process_controls), which every
// claim of the process reads. A row one transaction inserts is invisible
// to the others until it commits, and a second insert of the same key
// waits for it: so they are made outside any claim transaction, each by
// one statement that commits on its own, when a claim statement says they
// are missing, and the claim runs again with a snapshot that sees them.
// A pair's claim row is made once, for good (its token and version are the
// pair's history); a call's candidates get theirs all at once.

// rowAttempts bounds the attempts of one statement run on its own.
const rowAttempts = 3

// makeClaimRows makes the claim rows of the machines among ids that have
// none (WorkFencingEnsure), bounded by ctx.
func (q *queue) makeClaimRows(ctx context.Context, ids []uuid.UUID) error {
	err := q.autocommit(ctx, func(ctx context.Context) error {
		_, err := store.New(q.e.runner.DB).WorkFencingEnsure(ctx, store.WorkFencingEnsureParams{MachineIds: ids, Process: q.process})
		return err
	})
	if err != nil {
		return fmt.Errorf("making the claim rows of %d machines: %w", len(ids), err)
	}
	return nil
}

// makeControlsRow makes the controls row of the process (running, no cap)
// if it has none.
func (q *queue) makeControlsRow(ctx context.Context) error {
	err := q.autocommit(ctx, func(ctx context.Context) error {
		return store.New(q.e.runner.DB).ProcessControlEnsure(ctx, q.process)
	})
	if err != nil {
		return fmt.Errorf("making the controls row of %q: %w", q.process, err)
	}
	return nil
}

// autocommit runs stmt, one of bmdb's statements outside any transaction,
// bounded by ctx and the session, up to rowAttempts times while it fails
// with a serialization failure (a concurrent statement making the same
// rows, on a server whose default isolation is SERIALIZABLE) or a lost
// connection.
func (q *queue) autocommit(ctx context.Context, stmt func(ctx context.Context) error) error {
	ctx, stop := q.e.lease.Bound(ctx)
	defer stop()
	own := dbconn.Own(ctx)
	var err error
	for attempt := 1; attempt <= rowAttempts; attempt++ {
		err = stmt(own)
		if err == nil || ctx.Err() != nil || !(txn.Retryable(err) || dbconn.IsConnectionError(err)) {
			break
		}
		if werr := wait.Sleep(ctx, txn.RetryDelay(attempt)); werr != nil {
			break
		}
	}
	return dbconn.ContextError(ctx, err)
}
