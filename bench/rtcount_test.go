package main

import (
	"context"
	"database/sql"
	"testing"

	"github.com/lib/pq"
)

// TestRoundTripModel runs every kind of call the bench and bmdb make into
// lib/pq through the counting wrapper, on a connection the bench's dialer
// made, and checks that the round trips counted by lib/pq's protocol (how
// bmdb's are counted) are those on the socket, and the number expected:
// with and without lib/pq's binary_parameters.
func TestRoundTripModel(t *testing.T) {
	admin := adminDSN(t)
	for _, tc := range []struct {
		name   string
		binary bool
		want   int64
	}{
		// ping 1, simple 1, unprepared with a parameter 2, and with rows
		// 2, a long result 1, prepare, 2 runs and close 4, a transaction
		// of 4 (BEGIN, 2, COMMIT), a rolled back one 2, a failed statement
		// 2, a failed transaction 4 (BEGIN, 2, COMMIT, which lib/pq sends
		// as ROLLBACK).
		{"text parameters", false, 1 + 1 + 2 + 2 + 1 + 4 + 4 + 2 + 2 + 4},
		// Each statement with parameters in one round trip.
		{"binary_parameters", true, 1 + 1 + 1 + 1 + 1 + 4 + 3 + 2 + 1 + 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := admin
			if tc.binary {
				var err error
				if dsn, err = withParam(admin, "binary_parameters", "yes"); err != nil {
					t.Fatal(err)
				}
			}
			rt := newRTCounter(dsn)
			if rt.binary != tc.binary {
				t.Fatalf("binary_parameters seen %v, want %v", rt.binary, tc.binary)
			}
			connector, err := pq.NewConnector(dsn)
			if err != nil {
				t.Fatal(err)
			}
			connector.Dialer(&socketDialer{c: rt})
			db := sql.OpenDB(rt.wrap(connector))
			defer db.Close()
			db.SetMaxOpenConns(1)
			ctx := context.Background()
			if err := db.PingContext(ctx); err != nil { // connects: its start-up is not counted
				t.Fatal(err)
			}
			before := rt.snapshot()
			calls(t, ctx, db)
			got := rt.snapshot().since(before)
			if got.RoundTrips != got.Socket || got.RoundTrips != tc.want {
				t.Errorf("round trips: %d by lib/pq's protocol, %d on the socket, want %d; statements %v",
					got.RoundTrips, got.Socket, tc.want, got.Statements)
			}
			if n := got.Statements[labelBegin]; n != 3 {
				t.Errorf("%d BEGINs counted, want 3", n)
			}
		})
	}
}

// calls makes every kind of call once (see TestRoundTripModel's counts).
func calls(t *testing.T, ctx context.Context, db *sql.DB) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var n int64
	must(db.PingContext(ctx))
	_, err := db.ExecContext(ctx, `SELECT 1`)
	must(err)
	_, err = db.ExecContext(ctx, `SELECT $1::INT8`, 1)
	must(err)
	must(db.QueryRowContext(ctx, `SELECT $1::INT8`, 2).Scan(&n))
	rows, err := db.QueryContext(ctx, `SELECT g, repeat('x', 100) FROM generate_series(1, 2000) g`)
	must(err)
	for rows.Next() {
		n++
	}
	must(rows.Err())
	st, err := db.PrepareContext(ctx, `SELECT $1::INT8 + 1`)
	must(err)
	must(st.QueryRowContext(ctx, 3).Scan(&n))
	_, err = st.ExecContext(ctx, 4)
	must(err)
	must(st.Close())
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	must(err)
	_, err = tx.ExecContext(ctx, `SELECT $1::INT8`, 5)
	must(err)
	must(tx.Commit())
	tx, err = db.BeginTx(ctx, nil)
	must(err)
	must(tx.Rollback())
	if _, err := db.ExecContext(ctx, `SELECT 1 / $1::INT8`, 0); err == nil {
		t.Fatal("division by zero succeeded")
	}
	tx, err = db.BeginTx(ctx, nil)
	must(err)
	if _, err := tx.ExecContext(ctx, `SELECT 1 / $1::INT8`, 0); err == nil {
		t.Fatal("division by zero succeeded")
	}
	if err := tx.Commit(); err == nil {
		t.Fatal("a failed transaction committed")
	}
}

func TestStatementLabel(t *testing.T) {
	for q, want := range map[string]string{
		"-- name: WorkClaimMany :many\nWITH live AS (...)": "WorkClaimMany",
		commitSQL:                              "delete pending tag (application)",
		"commit":                               "COMMIT",
		"begin isolation level read committed": "BEGIN",
		"  SELECT   1\n  FROM t ":              "SELECT 1 FROM t",
	} {
		if got := statementLabel(q); got != want {
			t.Errorf("statementLabel(%q) = %q, want %q", q, got, want)
		}
	}
}
