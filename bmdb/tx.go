package bmdb

import (
	"context"
	"fmt"
	"reflect"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/txn"
	"github.com/bmdb-dev/bmdb/model"
)

// Tx is one attempt of a bmdb transaction. It is valid only inside the
// callback it was passed to, and not safe for concurrent use.
type Tx struct {
	t *txn.Tx
	r *model.Queries // the read-only queries handed to callbacks
}

func newTx(t *txn.Tx) *Tx { return &Tx{t: t, r: model.New(t.App())} }

// Queries returns bmdb's read-only queries (the operator views, a
// machine's history and backoffs, MachinesWithoutWork, ...) bound to the
// transaction. bmdb's own write statements are not among them: claims,
// ends, sessions and backoffs change only through Session and Work, which
// check and fence them. (Package model has no write statement at all;
// bmdb's are in an internal package.)
func (t *Tx) Queries() *model.Queries { return t.r }

// DBTX returns the transaction as the interface sqlc generates for
// database/sql, so that an application passes it to its own sqlc package's
// New and runs its queries atomically with bmdb's. Do not commit or roll it
// back: bmdb does. It reaches every table, bmdb's included: leave bmdb's
// tables to bmdb's API (docs/roles.sql keeps a worker role from DDL, not
// from that). Every statement run through it counts as a write after the
// session's last check, which bmdb then checks again before COMMIT.
func (t *Tx) DBTX() model.DBTX { return t.t.App() }

// Once returns fn's result in the transaction: fn runs only if no earlier
// call with an equal key (a comparable value, as a map key) returned one
// without an error in the same attempt of the transaction; a retried
// attempt starts with none. It shares a read among the callbacks that run
// in one transaction, which are the calls of one batch: worker.Loop's
// handlers run their common retrieval once per batch this way, rather than
// once per claim. fn runs on the caller's goroutine; an error it returns is
// returned and not remembered, so a later call runs fn again. What fn
// returns is shared: a caller that changes it (shuffles a slice, say)
// changes it for the others, so copy it first. A nil key or fn, or a key
// that is not comparable, returns an error wrapping ErrInvalidArgument.
func (t *Tx) Once(key any, fn func() (any, error)) (any, error) {
	if key == nil || fn == nil || !reflect.ValueOf(key).Comparable() {
		return nil, invalidArgument("Tx.Once: the key must be a comparable non-nil value and fn not nil (key %T)", key)
	}
	return t.t.Once(key, fn)
}

// CreateMachines inserts n new machines in the transaction and returns
// their ids. It returns an error wrapping ErrInvalidArgument for n outside
// [1, MaxCreateMachines]: one call is one INSERT, and on CockroachDB a
// transaction must reach its commit within Config.MaxTransactionDuration.
// Create more machines in several transactions.
func (t *Tx) CreateMachines(ctx context.Context, n int) ([]uuid.UUID, error) {
	if n < 1 || n > MaxCreateMachines {
		return nil, invalidArgument("CreateMachines: n is %d, must be in [1, %d] (create more in several transactions)", n, MaxCreateMachines)
	}
	ids, err := t.t.Store().MachineCreateMany(ctx, int64(n))
	if err != nil {
		return nil, fmt.Errorf("bmdb: creating %d machines: %w", n, err)
	}
	return ids, nil
}
