package worker

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/bmdbtest"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// runAllAsync runs RunAll(loops) in the background and returns its result
// channel; the run is cancelled at the test's end.
func runAllAsync(t *testing.T, loops ...*Loop) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ran <- RunAll(ctx, loops...)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("RunAll did not return after its context ended")
		}
	})
	return ran
}

// The pipeline's stages: inventory tags a machine inventoried, and
// burn-in, whose input that tag is, tags it done.
const (
	inventory = "inventory"
	burnIn    = "burn-in"
)

// newPipelineEnv is newEnv with the inventoried tag table.
func newPipelineEnv(t *testing.T, n int) *env {
	t.Helper()
	e := newEnv(t, n)
	if _, err := e.db.Exec("CREATE TABLE inventoried (machine_id UUID PRIMARY KEY REFERENCES machines)"); err != nil {
		t.Fatal(err)
	}
	return e
}

// retrieveWhere proposes the machines that cond (on m, a machine) holds
// for and that have no live claim of process.
func retrieveWhere(process, cond string) Retrieve {
	return func(ctx context.Context, tx *bmdb.Tx, limit int32) ([]uuid.UUID, error) {
		rows, err := tx.DBTX().QueryContext(ctx, `
			SELECT m.machine_id FROM machines m
			WHERE `+cond+`
			  AND NOT EXISTS (SELECT 1 FROM work w JOIN sessions s USING (session_id)
			                  WHERE w.machine_id = m.machine_id AND w.process = $2 AND s.deadline > now())
			ORDER BY m.machine_id LIMIT $1`, limit, process)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var ids []uuid.UUID
		for rows.Next() {
			var id uuid.UUID
			if err := rows.Scan(&id); err != nil {
				return nil, err
			}
			ids = append(ids, id)
		}
		return ids, rows.Err()
	}
}

var (
	retrieveNotInventoried = retrieveWhere(inventory, "NOT EXISTS (SELECT 1 FROM inventoried i WHERE i.machine_id = m.machine_id)")
	retrieveNotBurnedIn    = retrieveWhere(burnIn, `EXISTS (SELECT 1 FROM inventoried i WHERE i.machine_id = m.machine_id)
			  AND NOT EXISTS (SELECT 1 FROM done d WHERE d.machine_id = m.machine_id)`)
)

func markInventoried(w *bmdb.Work) func(*bmdb.Tx) error {
	return func(tx *bmdb.Tx) error {
		_, err := tx.DBTX().ExecContext(context.Background(), "INSERT INTO inventoried VALUES ($1)", w.Machine())
		return err
	}
}

// pipeline returns the two stages' loops, configured as cfg: inventory's
// Work runs inventoryWork, burn-in's runs burn (nil: succeeds at once);
// burnInCfg, if not nil, changes burn-in's configuration.
func (e *env) pipeline(inventoryWork func(ctx context.Context) error, burn func(w *bmdb.Work) error, cfg Config, burnInCfg func(*Config)) (inv, bur *Loop) {
	e.t.Helper()
	cfg.Process, cfg.Retrieve = inventory, retrieveNotInventoried
	cfg.Work = func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
		if err := inventoryWork(ctx); err != nil {
			return nil, err
		}
		return markInventoried(w), nil
	}
	inv, err := New(e.conn, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	cfg.Process, cfg.Retrieve, cfg.Concurrency = burnIn, retrieveNotBurnedIn, 4
	if burnInCfg != nil {
		burnInCfg(&cfg)
	}
	cfg.Work = func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
		if burn != nil {
			if err := burn(w); err != nil {
				return nil, err
			}
		}
		return markDone(w), nil
	}
	bur, err = New(e.conn, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return inv, bur
}

// takes is an inventory's work that takes d.
func takes(d time.Duration) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// The case: a slow first stage, whose machines become the second
// stage's input one by one as it finishes them. RunAll returns nil only
// once the second stage has done every machine. Each machine's inventory
// takes until the burn-in has done the machines before it and has then
// been idle for its StopWhenIdle (three claims found nothing: the third
// confirms that nothing is left), as far as the burn-in knows done (or 5 s,
// if the burn-in does not get there: it stopped already); the
// burn-in then polls again only 0.5 to 1 s later (PollMin), while the
// inventory is idle, and done, 100 ms after its last machine: the group
// must not take the burn-in's word from before that machine for its
// state then.
func TestRunAllPipeline(t *testing.T) {
	const machines = 3
	e := newPipelineEnv(t, machines)
	var bur *Loop
	var inventoried atomic.Int64
	slow := func(ctx context.Context) error {
		before := inventoried.Add(1) - 1 // machines inventoried before this one
		var nothing int64 = -1           // burn-in's vain claims once it had done them
		giveUp := time.After(5 * time.Second)
		for {
			switch s := bur.Stats(); {
			case s.Finished < before:
			case nothing < 0:
				nothing = s.NothingToDo
			case s.NothingToDo >= nothing+3:
				return nil
			}
			select {
			case <-time.After(5 * time.Millisecond):
			case <-giveUp:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	inv, bur := e.pipeline(slow, nil, Config{
		Concurrency: 1,
		PollMin:     10 * time.Millisecond, PollMax: 20 * time.Millisecond,
		StopWhenIdle: 100 * time.Millisecond,
	}, func(c *Config) { c.PollMin, c.PollMax = time.Second, time.Second })
	if err := returned(t, runAllAsync(t, inv, bur), 2*time.Minute); err != nil {
		t.Fatalf("RunAll = %v, want nil", err)
	}
	if n := e.count("SELECT count(*) FROM done"); n != machines {
		t.Fatalf("%d machines burned in, want %d", n, machines)
	}
	bmdbtest.RequireFinishedOnce(t, e.db, inventory, e.machines()...)
	bmdbtest.RequireFinishedOnce(t, e.db, burnIn, e.machines()...)
	if s := bur.Stats(); s.Finished != machines {
		t.Errorf("burn-in: %+v, want %d machines finished", s, machines)
	}
	if n := e.count("SELECT count(*) FROM sessions"); n != 0 {
		t.Errorf("%d sessions left after RunAll returned", n)
	}
}

// A stage that leaves work (a machine in backoff) makes RunAll's error a
// *GroupLeftError that names the stage and counts what it left, once
// every stage is idle; the other stages left nothing.
func TestRunAllWorkLeft(t *testing.T) {
	const machines = 5
	e := newPipelineEnv(t, machines)
	broken := e.machines()[2]
	inv, bur := e.pipeline(takes(50*time.Millisecond), func(w *bmdb.Work) error {
		if w.Machine() == broken {
			return errors.New("memory test failed")
		}
		return nil
	}, Config{
		Concurrency: 1,
		Backoff:     bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour, Exponent: 2},
		PollMin:     10 * time.Millisecond, PollMax: 50 * time.Millisecond,
		StopWhenIdle: 100 * time.Millisecond, DrainTimeout: 200 * time.Millisecond,
	}, nil)
	err := returned(t, runAllAsync(t, inv, bur), 2*time.Minute)
	var group *GroupLeftError
	var left *LeftError
	if !errors.As(err, &group) || !errors.Is(err, ErrWorkLeft) || !errors.As(err, &left) {
		t.Fatalf("RunAll = %v, want a *GroupLeftError", err)
	}
	if len(group.Left) != 1 || left != group.Left[0] || left.Process != burnIn || left.InBackoff != 1 || left.ClaimedByOthers != 0 {
		t.Fatalf("RunAll's work left: %+v, want burn-in's one machine in backoff", group.Left)
	}
	if want := "burn-in: 1 machines in backoff, 0 claimed by other sessions"; !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), inventory) {
		t.Errorf("RunAll's error says %q, want %q and nothing of the inventory", err, want)
	}
	if n := e.count("SELECT count(*) FROM done"); n != machines-1 {
		t.Errorf("%d machines burned in, want %d", n, machines-1)
	}
	if n := e.count("SELECT count(*) FROM inventoried"); n != machines {
		t.Errorf("%d machines inventoried, want %d", n, machines)
	}
}

// A permanent error of one stage stops every stage, and RunAll returns it,
// naming the stage, without waiting for the other stage's work beyond its
// ShutdownGrace.
func TestRunAllPermanentErrorStopsAll(t *testing.T) {
	e := newPipelineEnv(t, 3)
	working := make(chan struct{}, 3)
	inv, err := New(e.conn, Config{
		Process: inventory, Retrieve: retrieveNotInventoried,
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			working <- struct{}{}
			<-ctx.Done() // until its context is cancelled
			return nil, ctx.Err()
		},
		ShutdownGrace: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	bur, err := New(e.conn, Config{
		Process: burnIn, Retrieve: retrieveWhere(burnIn, "EXISTS (SELECT 1 FROM machine_burned_in b WHERE b.machine_id = m.machine_id)"),
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) { return markDone(w), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	err = returned(t, runAllAsync(t, inv, bur), time.Minute)
	checkPermanent(t, err, "42P01", "worker "+burnIn+": claiming")
	// A session that expired by itself on a loaded machine is not one
	// RunAll could close: its row waits for GC. Live ones must be gone.
	if n := e.count("SELECT count(*) FROM sessions WHERE deadline > now()"); n != 0 {
		t.Errorf("%d live sessions left after RunAll returned", n)
	}
	if n := e.count("SELECT count(*) FROM work w JOIN sessions s USING (session_id) WHERE s.deadline > now()"); n != 0 {
		t.Errorf("%d claims of live sessions left after RunAll returned", n)
	}
}

// Without StopWhenIdle, a group runs until its context is done, then shuts
// every loop down and returns nil.
func TestRunAllUntilCanceled(t *testing.T) {
	const machines = 4
	e := newPipelineEnv(t, machines)
	inv, bur := e.pipeline(takes(10*time.Millisecond), nil, Config{PollMin: 10 * time.Millisecond, PollMax: 50 * time.Millisecond}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- RunAll(ctx, inv, bur) }()
	testdb.Eventually(t, 30*time.Second, "every machine burned in", func() bool { return e.count("SELECT count(*) FROM done") == machines })
	select {
	case err := <-ran:
		t.Fatalf("RunAll returned (%v) before its context was done", err)
	default:
	}
	cancel()
	if err := returned(t, ran, 30*time.Second); err != nil {
		t.Fatalf("RunAll = %v, want nil", err)
	}
	if n := e.count("SELECT count(*) FROM sessions"); n != 0 {
		t.Errorf("%d sessions left after RunAll returned", n)
	}
}

// RunAll refuses what it cannot run, naming what is wrong.
func TestRunAllRefuses(t *testing.T) {
	e := newEnv(t, 0)
	loop := func(idle time.Duration) *Loop {
		l, err := New(e.conn, Config{Process: process, Retrieve: retrieveNotDone, StopWhenIdle: idle,
			Work: func(context.Context, *bmdb.Work) (func(*bmdb.Tx) error, error) { return nil, nil }})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b := loop(time.Second), loop(0)
	for _, tc := range []struct {
		name  string
		loops []*Loop
		want  string
	}{
		{"none", nil, "no loops"},
		{"nil", []*Loop{a, nil}, "loops[1] is nil"},
		{"repeated", []*Loop{a, a}, "loops[0] and loops[1] are the same Loop"},
		{"mixed StopWhenIdle", []*Loop{a, b}, "loops[0] (install) has StopWhenIdle 1s, loops[1] (install) 0s"},
	} {
		err := RunAll(context.Background(), tc.loops...)
		if !errors.Is(err, bmdb.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: RunAll = %v, want ErrInvalidArgument saying %q", tc.name, err, tc.want)
		}
	}
	// A loop that ran cannot run again, alone or in a group; the loops
	// before it in the group are left as they were.
	ran, fresh := loop(time.Second), loop(time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ran.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if err := RunAll(ctx, fresh, ran); !errors.Is(err, ErrAlreadyRunning) || !strings.Contains(err.Error(), "loops[1]") {
		t.Errorf("RunAll with a loop that ran = %v, want ErrAlreadyRunning naming loops[1]", err)
	}
	if err := fresh.Run(ctx); err != nil {
		t.Errorf("Run of the loop RunAll refused = %v, want nil", err)
	}
}
