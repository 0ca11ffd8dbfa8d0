package bmdb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
)

// Claim transactions that overlap (issue 23): what holds when processes'
// batches run at once, at snapshot isolation on PostgreSQL ("Isolation" in
// doc.go), SERIALIZABLE in cockroach mode.

// stalledRetrieval is a retrieve that runs inner (which reads, taking the
// transaction's snapshot), then, the first time only, waits until released:
// a retrieval that read before what the test does next.
type stalledRetrieval struct {
	inner    func(*Tx) ([]uuid.UUID, error)
	read     chan struct{} // closed once the first call has read
	release  chan struct{}
	once     sync.Once
	released sync.Once
	calls    atomic.Int32
}

func newStalledRetrieval(inner func(*Tx) ([]uuid.UUID, error)) *stalledRetrieval {
	return &stalledRetrieval{inner: inner, read: make(chan struct{}), release: make(chan struct{})}
}

// stalledQuery is newStalledRetrieval of a query without parameters.
func stalledQuery(query string) *stalledRetrieval {
	return newStalledRetrieval(func(tx *Tx) ([]uuid.UUID, error) { return queryIDs(tx, query) })
}

func (r *stalledRetrieval) retrieve(tx *Tx) ([]uuid.UUID, error) {
	ids, err := r.inner(tx)
	if r.calls.Add(1) == 1 {
		r.once.Do(func() { close(r.read) })
		<-r.release
	}
	return ids, err
}

func (r *stalledRetrieval) open() { r.released.Do(func() { close(r.release) }) }

// A retrieval that read before another process claimed, processed and
// finished a machine, or that ignores claims and read while another process
// held it, claims nothing: the claim of (machine, process) commits only if
// no claim or end of the pair committed after its snapshot. With a
// machine whose claim row existed before (fenced) and one claimed for the
// first time. The first two find out at the claim (a stale candidate: the
// attempt runs again, and its retrieval finds nothing to do); the third's
// snapshot shows the machine held, which its claim skips
// (ErrWorkConflict), without locking it.
func TestStaleRetrievalClaimsNothing(t *testing.T) {
	const untagged = `SELECT machine_id FROM machines m
		WHERE NOT EXISTS (SELECT 1 FROM tag t WHERE t.machine_id = m.machine_id)
		  AND NOT EXISTS (SELECT 1 FROM work w WHERE w.machine_id = m.machine_id AND w.process = 'install')`
	const ignoresClaims = `SELECT machine_id FROM machines m
		WHERE NOT EXISTS (SELECT 1 FROM tag t WHERE t.machine_id = m.machine_id)`
	for _, tc := range []struct {
		name         string
		query        string
		claimedFirst bool // the other process holds the machine before the retrieval reads
		fenced       bool
		want         error
	}{
		{"read before the claim", untagged, false, true, ErrNothingToDo},
		{"read before the first claim", untagged, false, false, ErrNothingToDo},
		{"ignores claims, read while held", ignoresClaims, true, true, ErrWorkConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, c1, c2, s1, s2, _, _ := twoProcesses(t)
			m := e.machine()
			if tc.fenced {
				e.fence("install", m)
			}
			var held *Work
			if tc.claimedFirst {
				var err error
				if held, err = s1.Work(context.Background(), "install", retrieveAll(m)); err != nil {
					t.Fatal(err)
				}
			}
			stale := stalledQuery(tc.query)
			t.Cleanup(stale.open)
			late := workAsync(s2, stale.retrieve)
			<-stale.read // s2's snapshot sees m untagged (and, for the first, unclaimed)
			if held == nil {
				var err error
				if held, err = s1.Work(context.Background(), "install", retrieveAll(m)); err != nil {
					t.Fatal(err)
				}
			}
			if err := held.Finish(context.Background(), tagCommit(m)); err != nil {
				t.Fatal(err)
			}
			stale.open()
			w, err := late.wait()
			if !errors.Is(err, tc.want) && (snapshotIsolation() || !errors.Is(err, ErrNothingToDo)) {
				// Cockroach mode: PostgreSQL's SERIALIZABLE may abort the
				// stale claim for what it read (CockroachDB would not), and
				// its retry's retrieval finds the machine tagged.
				t.Fatalf("the stale retrieval's Work = %v, %v; want %v", w, err, tc.want)
			}
			if got := e.events(m, s1, s2); !slicesEqual(got, "install:Started@1", "install:Finished@1") {
				t.Errorf("history of m = %v, want one claim, by the first process", got)
			}
			if st := c2.Stats(); st.TxLockTimeouts != 0 || st.TxDeadlocks != 0 {
				t.Errorf("the stale process's stats %+v: want no lock wait", st)
			}
			if !snapshotIsolation() {
				return // cockroach mode: SERIALIZABLE, the stale claim retried
			}
			if st := c2.Stats(); st.TxRetries != 0 || tc.fenced && !tc.claimedFirst && st.ClaimsStale == 0 {
				t.Errorf("the stale process's stats %+v: want no retry, and its stale candidate counted", st)
			}
			if st := c1.Stats(); st.TxRetries != 0 {
				t.Errorf("the first process's stats %+v: want no retry", st)
			}
		})
	}
}

// A claim transaction stalled in one Connection (a slow retrieval; a paused
// process or a slow network does the same), or stalled right before its
// COMMIT while it holds a claim, adds less than 100 ms to another
// Connection's claims and ends, after the two ran side by side: nothing
// serializes the processes' batches. A claim of the machine the stalled
// transaction is claiming skips it, without waiting.
func TestStalledClaimTransactionStaysLocal(t *testing.T) {
	for _, where := range []string{"in its retrieval", "before its commit"} {
		t.Run(where, func(t *testing.T) {
			e, _, c2, s1, s2, gate, gated := twoProcesses(t)
			for range 40 {
				e.machine()
			}
			held := e.machine()
			e.exec("INSERT INTO tag VALUES ($1)", held) // not a candidate of the cycles below
			cycle := func(s *Session) (time.Duration, error) {
				start := time.Now()
				w, err := s.Work(context.Background(), "install", retrieveUnclaimed)
				if err != nil {
					return 0, err
				}
				return time.Since(start), w.Finish(context.Background(), tagCommit(w.Machine()))
			}
			// Side by side first, as long as processes meet.
			var side sync.WaitGroup
			var baseline []time.Duration
			var sideErr error
			side.Go(func() {
				for range 5 {
					if _, err := cycle(s1); err != nil {
						sideErr = err
					}
				}
			})
			for range 5 {
				d, err := cycle(s2)
				if err != nil {
					t.Fatal(err)
				}
				baseline = append(baseline, d)
			}
			side.Wait()
			if sideErr != nil {
				t.Fatal(sideErr)
			}

			// Then the first process's claim transaction stalls.
			var stalled *pendingWork
			var release func()
			switch where {
			case "in its retrieval":
				r := newStalledRetrieval(func(tx *Tx) ([]uuid.UUID, error) {
					var one int
					err := tx.DBTX().QueryRowContext(context.Background(), "SELECT 1").Scan(&one)
					return []uuid.UUID{held}, err
				})
				stalled, release = workAsync(s1, r.retrieve), r.open
				<-r.read
			case "before its commit":
				id := s1.ID()
				gated.Store(&id)
				stalled, release = workAsync(s1, retrieveAll(held)), gate.open
				<-gate.held // its claim of held is made, not committed
			}
			t.Cleanup(release)
			var during []time.Duration
			for range 5 {
				d, err := cycle(s2)
				if err != nil {
					t.Fatal(err)
				}
				during = append(during, d)
			}
			start := time.Now()
			if w, err := s2.Work(context.Background(), "install", retrieveAll(held)); where == "before its commit" && !errors.Is(err, ErrWorkConflict) {
				t.Errorf("Work of the machine being claimed = %v, %v; want ErrWorkConflict", w, err)
			} else if err == nil {
				_ = w.Cancel(context.Background())
			}
			during = append(during, time.Since(start))
			release()
			if _, err := stalled.wait(); err != nil {
				t.Fatalf("the stalled Work: %v", err)
			}
			// Typical against typical: on a loaded machine one cycle of
			// either side may take long for reasons of its own. A claim
			// that waited for the stalled transaction would take far
			// longer: until lock_timeout (a quarter of the interval), or
			// until the stall ends.
			slices.Sort(baseline)
			slices.Sort(during)
			typical, typicalDuring, worst := baseline[len(baseline)/2], during[len(during)/2], slices.Max(during)
			t.Logf("claims beside the stalled transaction: typical %v, worst %v; typical before %v", typicalDuring, worst, typical)
			if typicalDuring-typical >= 100*time.Millisecond {
				t.Errorf("claims beside the stalled transaction took typically %v, %v more than before", typicalDuring, typicalDuring-typical)
			}
			if worst >= time.Second {
				t.Errorf("a claim beside the stalled transaction took %v: it waited for it", worst)
			}
			if st := c2.Stats(); st.TxLockTimeouts != 0 || st.TxDeadlocks != 0 {
				t.Errorf("the other process waited on locks: %+v", st)
			}
		})
	}
}

// Claims racing ends (Finish, Fail with backoff, Cancel), takeovers of
// expired sessions and stale Finishes of the same few machines, from
// several Connections: the history of every machine is one claim at a time
// (each Started followed by exactly one end of the same claim before the
// next Started), tokens grow with every claim, no claim starts before the
// backoff of a failure has passed (on the database clock), and a Finish
// after its session was taken over commits nothing.
func TestClaimsRacingEndsAndTakeovers(t *testing.T) {
	e := newWorkEnv(t)
	const machines, workers = 3, 6
	var ms []uuid.UUID
	for range machines {
		ms = append(ms, e.machine())
	}
	conns := []*Connection{e.open(), e.open()}
	for _, c := range conns {
		exact(c)
	}
	backoff := Backoff{Initial: 30 * time.Millisecond, Maximum: 30 * time.Millisecond, Exponent: 1}
	retrieve := func(*Tx) ([]uuid.UUID, error) {
		ids := slices.Clone(ms)
		rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		return ids, nil
	}
	deadline := time.Now().Add(2 * time.Second)
	var staleFinishes atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for i := range workers {
		c := conns[i%len(conns)]
		wg.Go(func() {
			var s *Session
			defer func() {
				if s != nil {
					s.Close(context.Background())
				}
			}()
			for time.Now().Before(deadline) {
				if s == nil || s.Err() != nil {
					if s != nil {
						s.Close(context.Background())
					}
					var err error
					if s, err = c.StartSession(context.Background()); err != nil {
						errs <- err
						return
					}
				}
				w, err := s.Work(context.Background(), "install", retrieve)
				switch {
				case errors.Is(err, ErrWorkConflict) || errors.Is(err, ErrNothingToDo):
					time.Sleep(time.Millisecond)
					continue
				case errors.Is(err, ErrSessionExpired):
					continue
				case err != nil:
					errs <- err
					return
				}
				switch rand.N(5) {
				case 0:
					err = w.Finish(context.Background(), noCommit)
				case 1:
					err = w.Fail(context.Background(), &backoff, "racing")
				case 2:
					err = w.Cancel(context.Background())
				default:
					// Expire the session under the claim, and let the
					// others take it over; then try to finish it.
					e.expireInDB(s.ID(), time.Millisecond)
					time.Sleep(time.Duration(rand.N(20)) * time.Millisecond)
					err = w.Finish(context.Background(), func(tx *Tx) error {
						_, err := tx.DBTX().ExecContext(context.Background(), "INSERT INTO tag VALUES ($1) ON CONFLICT DO NOTHING", w.Machine())
						return err
					})
					if err == nil {
						staleFinishes.Add(1) // committed before any takeover: allowed
					} else if claimGone(err) {
						err = nil
					}
				}
				if claimGone(err) {
					err = nil
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	type event struct {
		id    int64
		at    time.Time
		event string
		claim uuid.UUID
		token int64
	}
	rows, err := e.db.Query(`SELECT h.id, h.machine_id, h.at, h.event, h.claim_id, COALESCE(h.fencing_token, 0)
		FROM work_history h WHERE h.process = 'install' ORDER BY h.machine_id, h.at, h.id`)
	if err != nil {
		t.Fatal(err)
	}
	history := map[uuid.UUID][]event{}
	for rows.Next() {
		var m uuid.UUID
		var ev event
		var claim uuid.NullUUID
		if err := rows.Scan(&ev.id, &m, &ev.at, &ev.event, &claim, &ev.token); err != nil {
			t.Fatal(err)
		}
		ev.claim = claim.UUID
		history[m] = append(history[m], ev)
	}
	rows.Close()
	claims := 0
	for _, m := range ms {
		h := history[m]
		sort.SliceStable(h, func(i, j int) bool { return h[i].at.Before(h[j].at) || h[i].at.Equal(h[j].at) && h[i].id < h[j].id })
		var open *event
		var lastToken int64
		var failedAt time.Time
		for i := range h {
			ev := &h[i]
			if ev.event == "Started" {
				claims++
				if open != nil {
					t.Fatalf("machine %s: claim %s started at %v while claim %s (started %v) was held", m, ev.claim, ev.at, open.claim, open.at)
				}
				if ev.token <= lastToken {
					t.Errorf("machine %s: token %d after %d", m, ev.token, lastToken)
				}
				if !failedAt.IsZero() && ev.at.Sub(failedAt) < backoff.Initial {
					t.Errorf("machine %s: claimed %v after a failure, within its %v backoff", m, ev.at.Sub(failedAt), backoff.Initial)
				}
				lastToken, open, failedAt = ev.token, ev, time.Time{}
				continue
			}
			if open == nil || open.claim != ev.claim {
				t.Fatalf("machine %s: %s of claim %s at %v, which is not the one held (%v)", m, ev.event, ev.claim, ev.at, open)
			}
			if ev.event == "Failed" {
				failedAt = ev.at
			}
			open = nil
		}
	}
	// Every claim and every end wrote the pair's claim row: its version
	// counts them (what makes a stale claim fail under snapshot isolation).
	for _, m := range ms {
		version := e.count("SELECT version FROM work_fencing WHERE machine_id = $1 AND process = 'install'", m)
		if n := len(history[m]); version != n {
			t.Errorf("machine %s: claim row version %d, after %d claims and ends", m, version, n)
		}
	}
	t.Logf("%d claims of %d machines; %d finishes of an expired session committed before a takeover", claims, machines, staleFinishes.Load())
	if claims < 3*machines {
		t.Errorf("only %d claims: the race did not race", claims)
	}
	// A Finish whose claim was taken over committed nothing: every tagged
	// machine's last Finished claim is the one whose commit tagged it, and
	// no Finished row follows an Abandoned row of the same claim (checked
	// above: an end of a claim no longer held fails the history check).
}

// What snapshot isolation does not give (see "Isolation" in doc.go), and
// how an application gets it. Write skew: an operator's tool quarantines a
// machine only if no process works on it, and a claim's retrieval skips
// quarantined machines; each reads what the other writes. With the claim's
// retrieval between its read and its claim while the quarantine runs, at
// snapshot isolation both commit: the machine is claimed and quarantined.
// SerializableBatches (with the tool's transaction SERIALIZABLE too, as
// Session.Transact is) aborts the claim, which runs again and finds the
// quarantine. At snapshot isolation, the retrieval's FOR SHARE of the
// status row, with the tool writing that row before it looks for claims
// (READ COMMITTED: each statement sees what committed before it), makes
// the tool wait for the claim and then see it.
func TestWriteSkewAndItsRemedies(t *testing.T) {
	const quarantine = "UPDATE status SET quarantined = TRUE WHERE machine_id = $1"
	const working = "SELECT count(*) FROM work WHERE machine_id = $1 AND process = 'install'"
	for _, tc := range []struct {
		name       string
		serial     bool
		lock       string
		skew       bool // the claim and the quarantine both commit
		lockedTool bool // the tool writes first, then looks, in READ COMMITTED
	}{
		{"snapshot", false, "", true, false},
		{"serializable", true, "", false, false},
		{"snapshot, FOR SHARE", false, " FOR SHARE OF s", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !snapshotIsolation() && !tc.serial {
				t.Skip("cockroach mode: batches are SERIALIZABLE")
			}
			e := newWorkEnv(t)
			e.exec("CREATE TABLE status (machine_id UUID PRIMARY KEY REFERENCES machines, quarantined BOOLEAN NOT NULL DEFAULT FALSE)")
			// Steady sessions: the subject is isolation, not expiry. With
			// 1 s, the claim statement set the transaction's idle timeout
			// to the session's time left (under a second), and a loaded
			// machine that stalled the batch that long before its COMMIT
			// had PostgreSQL end the transaction: an ambiguous commit.
			c := e.open(steady, func(c *Config) { c.SerializableBatches = tc.serial })
			exact(c)
			tool := e.open(steady)
			exact(tool)
			s, st := e.session(c), e.session(tool)
			m := e.machine()
			e.fence("install", m)
			e.exec("INSERT INTO status (machine_id) VALUES ($1)", m)
			r := stalledQuery(`SELECT s.machine_id FROM status s WHERE NOT s.quarantined` + tc.lock)
			t.Cleanup(r.open)
			claim := workAsync(s, r.retrieve)
			<-r.read
			// The tool: quarantine m if no process works on it.
			var quarantined atomic.Bool
			toolDone := make(chan error, 1)
			go func() {
				ctx := context.Background()
				if tc.lockedTool {
					tx, err := e.db.BeginTx(ctx, nil) // READ COMMITTED
					if err != nil {
						toolDone <- err
						return
					}
					defer tx.Rollback()
					var n int
					if _, err := tx.ExecContext(ctx, quarantine, m); err != nil {
						toolDone <- err
						return
					}
					if err := tx.QueryRowContext(ctx, working, m).Scan(&n); err != nil || n > 0 {
						toolDone <- err // busy: refuse, rolled back
						return
					}
					quarantined.Store(true)
					toolDone <- tx.Commit()
					return
				}
				toolDone <- st.Transact(ctx, func(tx *Tx) error {
					var n int
					quarantined.Store(false)
					if err := tx.DBTX().QueryRowContext(ctx, working, m).Scan(&n); err != nil || n > 0 {
						return err
					}
					_, err := tx.DBTX().ExecContext(ctx, quarantine, m)
					quarantined.Store(err == nil)
					return err
				})
			}()
			if tc.lockedTool { // it waits for the claim's lock
				eventually(t, 5*time.Second, "the tool waiting", func() bool {
					return e.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
						AND wait_event_type = 'Lock' AND query LIKE 'UPDATE status%'`) == 1
				})
			} else if err := <-toolDone; err != nil {
				t.Fatal(err)
			}
			r.open()
			w, err := claim.wait()
			if tc.lockedTool {
				if err := <-toolDone; err != nil {
					t.Fatal(err)
				}
			}
			if err != nil && !errors.Is(err, ErrNothingToDo) {
				t.Fatalf("Work: %v", err)
			}
			claimed, isQuarantined := err == nil, e.count("SELECT count(*) FROM status WHERE quarantined") == 1
			t.Logf("claimed %v, quarantined %v", claimed, isQuarantined)
			if skew := claimed && isQuarantined; skew != tc.skew {
				t.Errorf("claimed and quarantined both: %v, want %v", skew, tc.skew)
			}
			if !claimed && !isQuarantined {
				t.Error("neither claimed nor quarantined")
			}
			if w != nil {
				_ = w.Cancel(context.Background())
			}
		})
	}
}

// A session's batcher runs another batch beside one that is held
// (Config.MaxConcurrentBatches), on another connection: the calls queued
// behind the held batch commit while it waits. With a bound of 1, they wait
// for it.
func TestConcurrentBatchesOfASession(t *testing.T) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("MaxConcurrentBatches=%d", n), func(t *testing.T) {
			e := newWorkEnv(t)
			c := e.open(func(c *Config) { c.SessionInterval, c.MaxConcurrentBatches = 10*time.Second, n })
			exact(c)
			s := e.session(c)
			x, a := e.machine(), e.machine()
			e.fence("install", x, a)
			hold := newLatch()
			t.Cleanup(hold.open)
			first := workAsync(s, hold.held(retrieveAll(x)))
			hold.inside(t)
			second := workAsync(s, retrieveAll(a))
			if n > 1 {
				// It commits while the first is held, which it is until
				// hold.open: a generous deadline, not a timing margin.
				select {
				case <-second.done:
				case <-time.After(30 * time.Second):
					t.Fatal("the second Work waited for the held batch")
				}
				if w, err := second.wait(); err != nil || w.Machine() != a {
					t.Fatalf("second Work = %v, %v; want a", w, err)
				}
			} else {
				// It queues behind the held batch, and stays there: a
				// second runner would have taken it at once.
				eventually(t, 30*time.Second, "the second Work to queue or return", func() bool {
					select {
					case <-second.done:
						return true
					default:
						return queued(s, "install") == 1
					}
				})
				select {
				case <-second.done:
					t.Fatal("the second Work committed while the first batch was held, with one batch at a time")
				case <-time.After(time.Second):
				}
				if q := queued(s, "install"); q != 1 {
					t.Fatalf("%d calls queued behind the held batch, want the second Work", q)
				}
			}
			hold.open()
			if w, err := first.wait(); err != nil || w.Machine() != x {
				t.Fatalf("first Work = %v, %v; want x", w, err)
			}
			if w, err := second.wait(); err != nil || w.Machine() != a {
				t.Fatalf("second Work = %v, %v; want a", w, err)
			}
		})
	}
}
