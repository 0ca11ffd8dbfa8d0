package txn

import (
	"context"
	"database/sql"
	"os"
	"testing"

	_ "github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/internal/counters"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

func TestMain(m *testing.M) {
	os.Exit(testdb.Run(m, func(context.Context, string) error { return nil }))
}

// guard records whether each attempt needed its check before COMMIT.
type guard struct{ needed []bool }

func (g *guard) BeforeCommit(_ context.Context, tx *Tx) error {
	g.needed = append(g.needed, tx.NeedsCheck())
	tx.Checked()
	return nil
}

// The check before COMMIT is a property of the transaction: it is needed
// unless the last statement the attempt ran checked the session, whoever
// ran it, bmdb's statements or the application's. A body that writes after
// the check (here, after a statement that checked, as a claim statement
// does) gets it by itself.
func TestCheckBeforeCommitFollowsTheLastStatement(t *testing.T) {
	db, err := sql.Open("postgres", testdb.NewEmpty(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.Exec("CREATE TABLE t (x INT8)"); err != nil {
		t.Fatal(err)
	}
	r := &Runner{DB: db, MaxAttempts: 3, Counters: &counters.Counters{}}
	write := func(tx *Tx) error {
		_, err := tx.App().ExecContext(ctx, "INSERT INTO t VALUES (1)")
		return err
	}
	check := func(tx *Tx) error { // a statement that checks as it runs
		if _, err := tx.App().ExecContext(ctx, "SELECT 1"); err != nil {
			return err
		}
		tx.Checked()
		return nil
	}
	for _, tc := range []struct {
		name string
		body []func(*Tx) error
		want bool
	}{
		{"nothing ran", nil, true},
		{"a write, no check", []func(*Tx) error{write}, true},
		{"a write, then a check", []func(*Tx) error{write, check}, false},
		{"a check, then a write", []func(*Tx) error{check, write}, true},
		{"a check, then a prepared statement", []func(*Tx) error{check, func(tx *Tx) error {
			st, err := tx.App().PrepareContext(ctx, "SELECT 1")
			if err == nil {
				err = st.Close()
			}
			return err
		}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &guard{}
			err := r.Run(ctx, Serializable, g, func(tx *Tx) error {
				for _, step := range tc.body {
					if err := step(tx); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil || len(g.needed) != 1 || g.needed[0] != tc.want {
				t.Errorf("Run = %v; check before COMMIT needed %v, want %v", err, g.needed, tc.want)
			}
		})
	}
}
