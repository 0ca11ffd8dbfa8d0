package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"
)

// A dead worker's machines are worked again within one session interval of
// its session's deadline on the database clock, however many free machines
// wait before them, with the README's retrieval (MachinesWithoutWork: a
// claim of an expired session counts as none, and the claim that gets
// such a machine takes its session over) and with a retrieval that skips
// every claim row, live or not (a claim sweeps the process's expired claims
// every quarter interval). Before, both waited until the queue drained or
// garbage collection ran (30 s).
func TestDeadWorkersMachinesWorkedAgainWithinAnInterval(t *testing.T) {
	const interval = 2 * time.Second
	retrievals := map[string]func(ctx context.Context) func(*Tx) ([]uuid.UUID, error){
		"the README's retrieval": func(ctx context.Context) func(*Tx) ([]uuid.UUID, error) {
			// As examples/burnin's: what needs the process, without a live
			// claim of it.
			return func(tx *Tx) ([]uuid.UUID, error) {
				return queryIDs(tx, `SELECT machine_id FROM machines m
					WHERE NOT EXISTS (SELECT 1 FROM work_history h WHERE h.machine_id = m.machine_id AND h.event = 'Finished')
					  AND NOT EXISTS (SELECT 1 FROM work w JOIN sessions s ON s.session_id = w.session_id
					                  WHERE w.machine_id = m.machine_id AND w.process = 'install' AND s.deadline > now())
					ORDER BY machine_created_at, machine_id LIMIT 16`)
			}
		},
		"a retrieval that skips every claim": func(ctx context.Context) func(*Tx) ([]uuid.UUID, error) {
			return func(tx *Tx) ([]uuid.UUID, error) {
				return queryIDs(tx, `SELECT machine_id FROM machines m
					WHERE NOT EXISTS (SELECT 1 FROM work w WHERE w.machine_id = m.machine_id AND w.process = 'install')
					  AND NOT EXISTS (SELECT 1 FROM work_history h WHERE h.machine_id = m.machine_id AND h.event = 'Finished')
					ORDER BY machine_created_at, machine_id LIMIT 16`)
			}
		},
	}
	for _, free := range []int{4, 400} {
		for name, retrieval := range retrievals {
			t.Run(fmt.Sprintf("%d free, %s", free, name), func(t *testing.T) {
				e := newEnv(t)
				cfg := func(c *Config) { c.SessionInterval = interval }
				deadConn, liveConn := e.open(cfg), e.open(cfg)
				var stopped atomic.Bool
				deadConn.leaseHooks.BeforeHeartbeat = func(context.Context) error {
					if stopped.Load() {
						return errors.New("killed")
					}
					return nil
				}
				dead := e.session(deadConn)
				var held []uuid.UUID
				for range 5 {
					held = append(held, e.machine())
				}
				e.fence("install", held...)
				works, err := dead.WorkMany(context.Background(), "install", len(held), retrieveAll(held...))
				if err != nil || len(works) != len(held) {
					t.Fatalf("the dead worker's claims: %d, %v", len(works), err)
				}
				for range free {
					e.machine()
				}
				// The worker dies: no more heartbeats, its deadline half a
				// second away.
				stopped.Store(true)
				var deadline time.Time
				if err := e.db.QueryRow(`UPDATE sessions SET deadline = now() + INTERVAL '500 milliseconds'
					WHERE session_id = $1 RETURNING deadline`, dead.ID()).Scan(&deadline); err != nil {
					t.Fatal(err)
				}

				ctx, cancel := context.WithCancel(context.Background())
				var claimers sync.WaitGroup
				var gapMu sync.Mutex
				var maxGap time.Duration // the longest a claimer took between two claim calls: the machine's scheduling delay
				for range 2 {
					s := e.session(liveConn)
					claimers.Go(func() {
						last := time.Now()
						for ctx.Err() == nil {
							w, err := s.Work(ctx, "install", retrieval(ctx))
							now := time.Now()
							gapMu.Lock()
							maxGap = max(maxGap, now.Sub(last))
							gapMu.Unlock()
							last = now
							if err != nil {
								if !errors.Is(err, ErrNothingToDo) && !errors.Is(err, ErrWorkConflict) && ctx.Err() == nil {
									t.Logf("claim: %v", err)
								}
								time.Sleep(5 * time.Millisecond)
								continue
							}
							time.Sleep(15 * time.Millisecond) // the work: 400 machines last past the bound
							_ = w.Finish(context.Background(), noCommit)
						}
					})
				}
				defer func() { cancel(); claimers.Wait() }()
				reclaimed := func() int {
					return e.count(`SELECT count(DISTINCT machine_id) FROM work_history
						WHERE machine_id = ANY ($1) AND event = 'Started' AND session_id <> $2`, pq.Array(held), dead.ID())
				}
				eventually(t, 10*interval, "the dead worker's machines claimed again", func() bool { return reclaimed() == len(held) })
				var last time.Time
				if err := e.db.QueryRow(`SELECT max(at) FROM (SELECT min(at) AS at FROM work_history
					WHERE machine_id = ANY ($1) AND event = 'Started' AND session_id <> $2 GROUP BY machine_id) f`,
					pq.Array(held), dead.ID()).Scan(&last); err != nil {
					t.Fatal(err)
				}
				left := e.count("SELECT count(*) FROM machines m WHERE NOT EXISTS (SELECT 1 FROM work_history h WHERE h.machine_id = m.machine_id AND h.event = 'Started')")
				// The claim that meets the dead claim (in its candidates, or
				// in the quarter-interval sweep) takes it over; the machine's
				// next claim may be the call after that one: two of the
				// longest gaps between claim calls that the run measured,
				// which is the machine's scheduling delay under load.
				gapMu.Lock()
				bound := interval + 2*maxGap
				gapMu.Unlock()
				took := last.Sub(deadline)
				t.Logf("reclaimed %v after the deadline (bound %v: the interval and twice the longest gap between claim calls), %d machines never claimed then",
					took.Round(time.Millisecond), bound.Round(time.Millisecond), left)
				if took > bound {
					t.Errorf("the dead worker's machines were claimed again %v after its deadline, more than %v; their history:", took, bound)
					logHistory(t, e.db, held, deadline)
				}
				// Garbage collection (every interval) may end some of the
				// claims first; the claims that took over count the rest.
				if n := liveConn.Stats().ClaimsTakenOver; n > int64(len(held)) {
					t.Errorf("Stats.ClaimsTakenOver = %d, more than the dead worker's %d claims", n, len(held))
				}
				if free == 400 && left == 0 {
					t.Errorf("the queue drained before the dead worker's machines were claimed again: not a test of a long queue")
				}
			})
		}
	}
}

// A slot of a capped process held by an expired session's claim does not
// keep a live session from claiming within the cap: the claim that finds
// no free slot takes the slot holders over, at once, and claims (before,
// nothing claimed until GC ran). Here the cap is 1, the dead session holds
// its one slot, and the live one asks for another machine.
func TestExpiredClaimsSlotIsTakenOver(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open(func(c *Config) { c.SessionInterval, c.GCPeriod = 10*time.Second, time.Hour })
	exact(c)
	dead, live := e.session(c), e.session(c)
	if _, err := live.CapProcess(context.Background(), "install", 1, ControlChange{Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	held, next := e.machine(), e.machine()
	e.fence("install", held, next)
	if _, err := dead.Work(context.Background(), "install", retrieveAll(held)); err != nil {
		t.Fatal(err)
	}
	if _, err := live.Work(context.Background(), "install", retrieveAll(next)); !errors.Is(err, ErrCapReached) {
		t.Fatalf("a second claim under a cap of 1 = %v, want ErrCapReached", err)
	}
	e.expireInDB(dead.ID(), time.Second)
	w, err := live.Work(context.Background(), "install", retrieveAll(next))
	if err != nil || w.Machine() != next {
		t.Fatalf("a claim under a cap of 1 whose slot an expired session holds = %v, %v; want the slot taken over", w, err)
	}
	if got := e.events(held, dead); !slicesEqual(got, "install:Started@1", "install:Abandoned@1") {
		t.Errorf("the dead session's claim: %v, want it Abandoned", got)
	}
	if n := c.Stats().ClaimsTakenOver; n != 1 {
		t.Errorf("Stats.ClaimsTakenOver = %d, want the one claim taken over", n)
	}
}

// logHistory logs the history of machines, each row's time from since.
func logHistory(t *testing.T, db *sql.DB, machines []uuid.UUID, since time.Time) {
	t.Helper()
	rows, err := db.Query(`SELECT machine_id, process, event, session_id, at - $2::TIMESTAMPTZ FROM work_history
		WHERE machine_id = ANY ($1) ORDER BY at, machine_id`, pq.Array(machines), since)
	if err != nil {
		t.Logf("reading the history: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var m, s uuid.UUID
		var process, event, after string
		if err := rows.Scan(&m, &process, &event, &s, &after); err != nil {
			t.Logf("reading the history: %v", err)
			return
		}
		t.Logf("  %s %s %s by session %s at %s", m, process, event, s, after)
	}
}
