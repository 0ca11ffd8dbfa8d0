package fleet

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/bmdbtest"
	"github.com/bmdb-dev/bmdb/cmd/worker-example/pipeline"
	"github.com/bmdb-dev/bmdb/cmd/worker-example/pipeline/pipelinedb"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
	"github.com/bmdb-dev/bmdb/migrations"
)

func TestMain(m *testing.M) { os.Exit(bmdbtest.Run(m, nil)) }

// seeded is a fleet of the example pipeline: 120 machines, of which busy
// is claimed by a live os-installer session for install-os, failed is in
// backoff for install-os, and done went through every stage, with 120
// events of history.
type seeded struct {
	db                 *sql.DB
	conn               *bmdb.Connection
	busy, failed, done uuid.UUID
	sess               *bmdb.Session
}

// one is a retrieval of machine id.
func one(id uuid.UUID) func(*bmdb.Tx) ([]uuid.UUID, error) {
	return func(*bmdb.Tx) ([]uuid.UUID, error) { return []uuid.UUID{id}, nil }
}

// open opens a fresh database with app's schema (none if nil).
func open(t *testing.T, component string, app *migrations.Application) (*bmdb.Connection, *bmdb.Session) {
	t.Helper()
	ctx := context.Background()
	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: testdb.New(t), ComponentName: component, RuntimeInfo: "host1 pid 42",
		SessionInterval: 10 * time.Second, Application: app})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	sess, err := conn.StartSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close(ctx) })
	return conn, sess
}

// machines creates n machines.
func machines(t *testing.T, sess *bmdb.Session, n int) []uuid.UUID {
	t.Helper()
	var ids []uuid.UUID
	ctx := context.Background()
	if err := sess.Transact(ctx, func(tx *bmdb.Tx) error {
		var err error
		ids, err = tx.CreateMachines(ctx, n)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return ids
}

func seed(t *testing.T) *seeded {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	conn, sess := open(t, "os-installer", pipeline.Application())
	q := pipelinedb.New(conn.DB())
	ids := machines(t, sess, 120)
	f := &seeded{db: conn.DB(), conn: conn, sess: sess, busy: ids[117], failed: ids[118], done: ids[119]}
	for _, m := range []uuid.UUID{f.busy, f.failed, f.done} {
		if err := q.MachineProvidedInsert(ctx, pipelinedb.MachineProvidedInsertParams{MachineID: m, Provider: "dc-west"}); err != nil {
			t.Fatal(err)
		}
		if err := q.MachineAgentStartedInsert(ctx, pipelinedb.MachineAgentStartedInsertParams{MachineID: m, AgentVersion: "v7"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sess.Work(ctx, "install-os", one(f.busy)); err != nil {
		t.Fatal(err)
	}
	w, err := sess.Work(ctx, "install-os", one(f.failed))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Fail(ctx, &bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour, Exponent: 2}, "PXE timeout"); err != nil {
		t.Fatal(err)
	}
	// done has a long history: 60 attempts, so its history pages.
	for i := range 60 {
		w, err := sess.Work(ctx, "install-os", one(f.done))
		if err != nil {
			t.Fatal(err)
		}
		if i < 59 {
			err = w.Cancel(ctx)
		} else {
			err = w.Finish(ctx, func(tx *bmdb.Tx) error {
				return pipelinedb.New(tx.DBTX()).MachineOSInstalledInsert(ctx, pipelinedb.MachineOSInstalledInsertParams{MachineID: f.done, OsImage: "debian-12"})
			})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// expire ends the seeded session on the database clock, as a frozen
// worker's would end: its claim of busy is stuck, install-os has no live
// session.
func (f *seeded) expire(t *testing.T) {
	t.Helper()
	if _, err := f.db.Exec("UPDATE sessions SET deadline = now() - interval '1 second' WHERE session_id = $1", f.sess.ID()); err != nil {
		t.Fatal(err)
	}
}

// idle is a fleet after a takeover, a GC of the rest of an expired
// session's claims, and a backoff that is over, with every session gone.
type idle struct {
	db                              *sql.DB
	takenOver, collected, backedOff uuid.UUID
	taker                           uuid.UUID // the session that took over
}

func seedIdle(t *testing.T) *idle {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	conn, frozen := open(t, "burner", nil)
	db := conn.DB()
	ids := machines(t, frozen, 3)
	h := &idle{db: db, takenOver: ids[0], collected: ids[1], backedOff: ids[2]}
	for _, m := range ids[:2] {
		if _, err := frozen.Work(ctx, "burn-in", one(m)); err != nil {
			t.Fatal(err)
		}
	}
	// The frozen worker's session expires on the database clock; another
	// takes one of its claims over, which abandons both.
	if _, err := db.Exec("UPDATE sessions SET deadline = now() - interval '1 second' WHERE session_id = $1", frozen.ID()); err != nil {
		t.Fatal(err)
	}
	taker, err := conn.StartSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h.taker = taker.ID()
	w, err := taker.Work(ctx, "burn-in", one(h.takenOver))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Finish(ctx, func(*bmdb.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	// A failure whose backoff is over by now (on the database clock).
	w, err = taker.Work(ctx, "memtest", one(h.backedOff))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Fail(ctx, &bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour, Exponent: 2}, "ECC errors"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE work_backoff SET until = now() - interval '1 minute' WHERE machine_id = $1", h.backedOff); err != nil {
		t.Fatal(err)
	}
	if err := taker.Close(ctx); err != nil {
		t.Fatal(err)
	}
	frozen.Close(ctx) // its row is gone already (taken over)
	return h
}

// health returns the overview's health of process.
func health(t *testing.T, o Overview, process string) ProcessHealth {
	t.Helper()
	for _, p := range o.Processes {
		if p.Process == process {
			return p
		}
	}
	t.Fatalf("overview has no process %s: %+v", process, o.Processes)
	return ProcessHealth{}
}

// overview reads the overview or fails the test.
func overview(t *testing.T, db *sql.DB) Overview {
	t.Helper()
	o, err := ReadOverview(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	return o
}
