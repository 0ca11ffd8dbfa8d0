package txn

import (
	"context"
	"database/sql"

	"github.com/bmdb-dev/bmdb/internal/dbconn"
	"github.com/bmdb-dev/bmdb/internal/store"
)

// Tx is one attempt of a transaction, as the rooms see it: every statement
// of the attempt passes through it, bmdb's (Store) and the application's
// (App), and it remembers whether one ran since the session was last
// checked (Checked, NeedsCheck), so that the check before COMMIT is a
// property of the transaction rather than a flag kept by hand: a write
// after the last check re-arms it by itself. Owned by the goroutine that
// runs the attempt; valid only during it.
type Tx struct {
	sql *sql.Tx
	// statements counts the statements run through the Tx; checkedAt is
	// statements at the last session check, -1 before any.
	statements, checkedAt int
	// opaque: a statement was prepared on the transaction, whose runs the
	// Tx does not see: every later check is needed.
	opaque bool
	// store is bmdb's statements on the Tx, made on first use.
	store *store.Queries
	// once holds Once's results, by key.
	once map[any]any
}

func newTx(tx *sql.Tx) *Tx { return &Tx{sql: tx, checkedAt: -1} }

// Once returns fn's result, running fn only if no earlier call of the
// attempt with an equal key returned one without an error: a read several
// callbacks of one batch share. An error is returned, not remembered.
func (t *Tx) Once(key any, fn func() (any, error)) (any, error) {
	if v, ok := t.once[key]; ok {
		return v, nil
	}
	v, err := fn()
	if err != nil {
		return nil, err
	}
	if t.once == nil {
		t.once = map[any]any{}
	}
	t.once[key] = v
	return v, nil
}

// DBTX is the interface sqlc generates for database/sql.
type DBTX interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
	PrepareContext(context.Context, string) (*sql.Stmt, error)
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

// Store returns bmdb's own statements on the transaction, kept prepared
// on every connection (dbconn.Own).
func (t *Tx) Store() *store.Queries {
	if t.store == nil {
		t.store = store.New(view{t: t, own: true})
	}
	return t.store
}

// App returns the transaction for the application's statements (bmdb.Tx's
// DBTX and Queries): they are counted like bmdb's.
func (t *Tx) App() DBTX { return view{t: t} }

// Checked records that the statement run last checked the session (the
// lease's checks, and the claim and end statements that check as they
// run).
func (t *Tx) Checked() { t.checkedAt = t.statements }

// EverChecked reports whether a statement of the attempt checked the
// session.
func (t *Tx) EverChecked() bool { return t.checkedAt >= 0 }

// NeedsCheck reports whether a statement ran since the session was last
// checked, or none checked it: then the check before COMMIT must run.
func (t *Tx) NeedsCheck() bool { return t.opaque || t.checkedAt < 0 || t.statements > t.checkedAt }

// view runs statements on a Tx, counting them; own marks them as bmdb's.
type view struct {
	t   *Tx
	own bool
}

func (v view) ctx(ctx context.Context) context.Context {
	v.t.statements++
	if v.own {
		return dbconn.Own(ctx)
	}
	return ctx
}

func (v view) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return v.t.sql.ExecContext(v.ctx(ctx), query, args...)
}

func (v view) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return v.t.sql.QueryContext(v.ctx(ctx), query, args...)
}

func (v view) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return v.t.sql.QueryRowContext(v.ctx(ctx), query, args...)
}

// PrepareContext prepares query on the transaction; the statement's runs
// pass outside the Tx, which then checks the session before COMMIT
// whatever ran last.
func (v view) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	v.t.opaque = true
	return v.t.sql.PrepareContext(v.ctx(ctx), query)
}
