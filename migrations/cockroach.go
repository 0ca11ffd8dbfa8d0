package migrations

import (
	"context"
	"database/sql"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
)

// Some keys must be spread on CockroachDB and not on PostgreSQL, which
// the shared migration files cannot say: CockroachDB stores a table in
// ranges ordered by primary key, and a key that grows with time sends
// every insert to the range at the end. work_history.id is BIGSERIAL,
// which CockroachDB makes unique_rowid(): time-ordered, so every history
// row of the fleet lands on one range. unordered_unique_rowid() is as
// unique and spreads them (PostgreSQL, whose heap is not ordered by key,
// keeps its sequence). Ties of work_history.at (events of one transaction)
// are then in no particular order on CockroachDB.
//
// This step runs on CockroachDB only, after bmdb's migrations, each
// checked without a lock first and applied under the migration lock.

// The one step of CockroachDB: constant text, idempotent. The check
// returns 1 when the step is in place, 0 otherwise (a missing table, as
// before migrating, included).
const (
	spreadHistoryName  = "work_history.id DEFAULT unordered_unique_rowid()"
	spreadHistoryCheck = `SELECT count(*) FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = 'work_history' AND column_name = 'id'
AND column_default LIKE '%unordered_unique_rowid%'`
	spreadHistoryApply = `ALTER TABLE work_history ALTER COLUMN id SET DEFAULT unordered_unique_rowid()`
)

// cockroachStepPending reports whether the CockroachDB step is not in place on db
// (a CockroachDB server).
func cockroachStepPending(ctx context.Context, db *sql.DB) (bool, error) {
	var n int
	if err := db.QueryRowContext(ctx, spreadHistoryCheck).Scan(&n); err != nil {
		return false, fmt.Errorf("migrations: checking %s: %w", spreadHistoryName, dbconn.ContextError(ctx, err))
	}
	return n == 0, nil
}

// applySteps applies, under the migration lock, the CockroachDB step if it
// is not in place, and returns the names of those it applied. It does
// nothing on PostgreSQL.
func (t *target) applySteps(ctx context.Context) ([]string, error) {
	if !t.cockroach {
		return nil, nil
	}
	pending, err := cockroachStepPending(ctx, t.db)
	if err != nil || !pending {
		return nil, err
	}
	klog.Infof("migrations: on CockroachDB: %s", spreadHistoryName)
	if _, err := t.db.ExecContext(ctx, spreadHistoryApply); err != nil {
		return nil, fmt.Errorf("migrations: applying %s: %w", spreadHistoryName, dbconn.ContextError(ctx, err))
	}
	return []string{spreadHistoryName}, nil
}
