package bmdb

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
)

// A role-level disallow_full_table_scans on CockroachDB must not break any
// of bmdb's statements: cockroach mode with the guardrail on (crdbmode's
// fullscan.go) refuses each statement that no index can serve, as
// CockroachDB refuses it, and the whole API runs under it: claims,
// takeovers, every end, controls, backoffs, GC and pruning. GC's listing of
// expired sessions scans the sessions table by design and lifts the
// guardrail for its own transaction.
func TestCockroachFullTableScansDisallowed(t *testing.T) {
	for _, v := range []crdbmode.Version{crdbmode.VersionOldest, crdbmode.VersionNewest} {
		t.Run(v.String(), func(t *testing.T) {
			e := newWorkEnv(t)
			c := e.open(withMode(crdbmode.Settings{Enabled: true, Version: v, DisallowFullTableScans: true}),
				func(c *Config) { c.SessionInterval = 3 * time.Second })
			ctx := context.Background()

			// The guardrail bites: a statement of bmdb's form that reads
			// the whole sessions table fails as CockroachDB fails it.
			_, err := c.DB().ExecContext(ctx, "-- name: Probe :exec\nDELETE FROM sessions WHERE component_name = 'none'")
			if pe := (*pq.Error)(nil); !errors.As(err, &pe) || pe.Code != "P0003" {
				t.Fatalf("a full scan of sessions under disallow_full_table_scans: %v, want SQLSTATE P0003", err)
			}

			s := e.session(c)
			var ids []uuid.UUID
			for range 6 {
				ids = append(ids, e.machine())
			}
			ch := ControlChange{By: "test", Reason: "full scans"}
			must := func(what string, err error) {
				t.Helper()
				if err != nil {
					t.Fatalf("%s under disallow_full_table_scans: %v", what, err)
				}
			}
			// Claims of machines with no claim rows yet, ends of each kind.
			w, err := s.Work(ctx, "install", retrieveAll(ids...))
			must("Work", err)
			next, claimErr, err := w.FinishAndWork(ctx, func(tx *Tx) error {
				_, err := tx.DBTX().ExecContext(ctx, "INSERT INTO tag VALUES ($1)", w.Machine())
				return err
			}, retrieveAll(ids...))
			must("FinishAndWork", errors.Join(err, claimErr))
			must("Fail", next.Fail(ctx, &Backoff{Initial: time.Hour, Maximum: time.Hour, Exponent: 2}, "broken"))
			must("ClearBackoff", s.ClearBackoff(ctx, next.Machine(), "install", "fixed"))
			works, err := s.WorkMany(ctx, "install", 2, retrieveAll(ids...))
			must("WorkMany", err)
			must("Cancel", works[0].Cancel(ctx))
			must("Finish", works[1].Finish(ctx, noCommit))
			must("Transact", s.Transact(ctx, func(tx *Tx) error {
				_, err := tx.DBTX().ExecContext(ctx, "SELECT 1")
				return err
			}))
			// Controls: a cap, a pause and a resume, a deletion.
			_, err = s.CapProcess(ctx, "install", 2, ch)
			must("CapProcess", err)
			capped, err := s.Work(ctx, "install", retrieveAll(ids...))
			must("Work with a cap", err)
			_, err = s.PauseProcess(ctx, "inventory", ch)
			must("PauseProcess", err)
			_, err = s.ResumeProcess(ctx, "inventory", ch)
			must("ResumeProcess", err)
			_, err = s.DeleteProcessControls(ctx, "inventory", ch)
			must("DeleteProcessControls", err)

			// A dead session's claim, taken over, and the session collected.
			dead := e.session(c)
			held, err := dead.Work(ctx, "inventory", retrieveAll(ids[0]))
			must("Work of the session to expire", err)
			e.expireInDB(dead.ID(), 500*time.Millisecond) // within GC's grace: the takeover, not a GC pass, ends its claim
			over, err := s.Work(ctx, "inventory", retrieveAll(held.Machine()))
			must("a takeover", err)
			gone := e.session(c)
			e.expireInDB(gone.ID(), time.Hour)
			_, err = c.CollectGarbage(ctx)
			must("CollectGarbage", err)
			if e.aliveInDB(gone.ID()) {
				t.Errorf("GC left the session expired an hour ago")
			}
			_, err = c.PruneHistory(ctx, time.Hour, 100)
			must("PruneHistory", err)
			must("Finish of a capped claim", capped.Finish(ctx, noCommit))
			must("Finish of a takeover", over.Finish(ctx, noCommit))
			must("Close", s.Close(ctx))
			if n := e.count("SELECT count(*) FROM work"); n != 0 {
				t.Errorf("%d claims left", n)
			}
		})
	}
}
