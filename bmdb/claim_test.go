package bmdb

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// commitGate holds the transactions of one session of c open right before
// their COMMIT (their claims made, uncommitted), until opened.
type commitGate struct {
	held    chan struct{} // closed when a transaction waits at the gate
	release chan struct{}
	once    sync.Once
}

// gateCommits installs a commitGate on c for session id's transactions.
func gateCommits(t *testing.T, c *Connection, id *atomic.Pointer[uuid.UUID]) *commitGate {
	g := &commitGate{held: make(chan struct{}), release: make(chan struct{})}
	var arrived sync.Once
	c.leaseHooks.BeforeCommit = func(session uuid.UUID) {
		if p := id.Load(); p != nil && *p == session {
			arrived.Do(func() { close(g.held) })
			<-g.release
		}
	}
	t.Cleanup(g.open)
	return g
}

func (g *commitGate) open() { g.once.Do(func() { close(g.release) }) }

// pendingWork is a Work call running on a goroutine of its own.
type pendingWork struct {
	done chan struct{} // closed when the call returned
	w    *Work
	err  error
}

// workAsync starts s.Work(process "install", retrieve) on a goroutine.
func workAsync(s *Session, retrieve func(*Tx) ([]uuid.UUID, error)) *pendingWork {
	p := &pendingWork{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.w, p.err = s.Work(context.Background(), "install", retrieve)
	}()
	return p
}

// wait returns the call's outcome once it has returned.
func (p *pendingWork) wait() (*Work, error) {
	<-p.done
	return p.w, p.err
}

// twoProcesses is the setup of the tests of claims racing across
// processes: two connections without injected failures, each with a
// session, the first's commits gated.
func twoProcesses(t *testing.T, mods ...func(*Config)) (e *env, c1, c2 *Connection, s1, s2 *Session, gate *commitGate, gated *atomic.Pointer[uuid.UUID]) {
	e = newWorkEnv(t)
	mods = append([]func(*Config){func(c *Config) {
		c.SessionInterval = 10 * time.Second
	}}, mods...)
	c1, c2 = e.open(mods...), e.open(mods...)
	exact(c1)
	exact(c2)
	gated = &atomic.Pointer[uuid.UUID]{}
	gate = gateCommits(t, c1, gated)
	s1, s2 = e.session(c1), e.session(c2)
	return e, c1, c2, s1, s2, gate, gated
}

// A claim skips a machine another transaction is claiming, instead of
// waiting for that claim to commit (and then failing on it): it takes the
// next candidate at once, or returns ErrWorkConflict if there is none,
// with no retry and no lock wait. Once the other transaction commits, the
// machine is claimed exactly once.
func TestClaimSkipsAMachineBeingClaimed(t *testing.T) {
	e, c1, c2, s1, s2, gate, gated := twoProcesses(t)
	a, b := e.machine(), e.machine()
	id := s1.ID()
	gated.Store(&id)
	first := workAsync(s1, retrieveAll(a))
	<-gate.held // s1 has claimed a and not committed

	w2, err := s2.Work(context.Background(), "install", retrieveAll(a, b))
	if err != nil || w2.Machine() != b {
		t.Fatalf("Work beside an uncommitted claim of a = %v, %v; want b", w2, err)
	}
	if _, err := s2.Work(context.Background(), "install", retrieveAll(a)); !errors.Is(err, ErrWorkConflict) {
		t.Errorf("Work of a machine being claimed = %v, want ErrWorkConflict", err)
	}
	select {
	case <-first.done:
		t.Fatal("s1's claim committed while its gate was closed")
	default:
	}
	if st := c2.Stats(); st.TxRetries != 0 || st.TxLockTimeouts != 0 || st.ClaimConflicts != 1 {
		t.Errorf("stats of the second process %+v: want no retry, no lock timeout, one conflict", st)
	}
	gate.open()
	if w1, err1 := first.wait(); err1 != nil || w1.Machine() != a {
		t.Fatalf("s1's Work = %v, %v; want a", w1, err1)
	}
	if n := e.count("SELECT count(*) FROM work_history WHERE machine_id = $1 AND event = 'Started'", a); n != 1 {
		t.Errorf("a claimed %d times, want once", n)
	}
	if st := c1.Stats(); st.TxRetries != 0 {
		t.Errorf("stats of the first process %+v: want no retry", st)
	}
}

// A takeover of an expired session's claim holds the machine like any
// claim: another process skips it meanwhile, and the machine's history has
// one Abandoned and one new Started.
func TestTakeoverWhileAnotherProcessSkips(t *testing.T) {
	e, _, c2, s1, s2, gate, gated := twoProcesses(t)
	s0 := e.session(e.open())
	m := e.machine()
	if _, err := s0.Work(context.Background(), "install", retrieveAll(m)); err != nil {
		t.Fatal(err)
	}
	e.expireInDB(s0.ID(), time.Millisecond)
	id := s1.ID()
	gated.Store(&id)
	takeover := workAsync(s1, retrieveAll(m))
	<-gate.held // s1 has taken m over and not committed

	if _, err := s2.Work(context.Background(), "install", retrieveAll(m)); !errors.Is(err, ErrWorkConflict) {
		t.Errorf("Work of a machine being taken over = %v, want ErrWorkConflict", err)
	}
	if st := c2.Stats(); st.TxLockTimeouts != 0 || st.TxDeadlocks != 0 {
		t.Errorf("stats of the skipping process %+v: want no lock wait", st)
	}
	gate.open()
	if w1, err1 := takeover.wait(); err1 != nil || w1.Machine() != m {
		t.Fatalf("takeover = %v, %v", w1, err1)
	}
	if got := e.events(m, s0, s1); !slicesEqual(got, "install:Started@1", "install:Abandoned@1", "install:Started@2") {
		t.Errorf("history = %v", got)
	}
}

// Backoff is enforced whatever the retrieval returns, with SKIP LOCKED as
// without: a machine in backoff is nothing to do, not a conflict.
func TestClaimRefusesABackedOffMachine(t *testing.T) {
	e, _, _, s1, _, _, _ := twoProcesses(t)
	m := e.machine()
	w, err := s1.Work(context.Background(), "install", retrieveAll(m))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Fail(context.Background(), &Backoff{Initial: time.Minute, Maximum: time.Hour, Exponent: 2}, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := s1.Work(context.Background(), "install", retrieveAll(m)); !errors.Is(err, ErrNothingToDo) {
		t.Errorf("Work of a machine in backoff = %v, want ErrNothingToDo", err)
	}
}

// GC racing a batch that takes the same expired claims over: each claim is
// Abandoned once, and claimed again at most once.
func TestGCRacingABatchTakingOver(t *testing.T) {
	e, c1, _, s1, _, _, _ := twoProcesses(t)
	// A steady session until it is expired below: its claims' subject is
	// not timing (a 1 s interval lapsed once beside three spinners).
	s0 := e.session(e.open(func(c *Config) { c.SessionInterval = 10 * time.Second }))
	ms := make([]uuid.UUID, 6)
	for i := range ms {
		ms[i] = e.machine()
	}
	if _, err := s0.WorkMany(context.Background(), "install", len(ms), retrieveAll(ms...)); err != nil {
		t.Fatal(err)
	}
	e.expireInDB(s0.ID(), time.Hour) // past any GC grace period
	var wg sync.WaitGroup
	var gcErr, claimErr error
	wg.Go(func() { _, gcErr = c1.CollectGarbage(context.Background()) })
	wg.Go(func() {
		for range ms {
			_, err := s1.Work(context.Background(), "install", retrieveAll(ms...))
			if err != nil && !errors.Is(err, ErrWorkConflict) {
				claimErr = err
				return
			}
		}
	})
	wg.Wait()
	if gcErr != nil || claimErr != nil {
		t.Fatalf("GC: %v; claims: %v", gcErr, claimErr)
	}
	for _, m := range ms {
		abandoned := e.count("SELECT count(*) FROM work_history WHERE machine_id = $1 AND event = 'Abandoned'", m)
		started := e.count("SELECT count(*) FROM work_history WHERE machine_id = $1 AND event = 'Started'", m)
		if abandoned != 1 || started > 2 {
			t.Errorf("machine %s: %d Abandoned (want 1), %d Started (want at most 2)", m, abandoned, started)
		}
	}
}

// raceProcesses runs k processes (each a Connection and a session) of
// goroutines each, all working on the test's untagged machines with
// retrieve until none is left, while a sampler counts claim statements
// seen waiting on a lock. It checks that every machine was finished
// exactly once and that no claim waited on another's (no lock timeout, no
// deadlock, no claim statement seen waiting), and returns each process's
// count of machines and its Stats.
//
// Without snapshot isolation, a transaction has raceAttempts attempts:
// PostgreSQL's SERIALIZABLE aborts these batches by page (about 4 retries
// a transaction here), where CockroachDB's conflicts are per key, and on
// a loaded machine, whose transactions overlap longer, a Finish once lost
// all of Config's default 100 to the 12 goroutines' claims. Every machine
// must still be finished, once, without an error.
func raceProcesses(t *testing.T, e *env, k, goroutines, machines int, retrieve func(*Tx) ([]uuid.UUID, error)) ([]int64, []Stats) {
	t.Helper()
	conns := make([]*Connection, k)
	sessions := make([]*Session, k)
	for i := range conns {
		conns[i] = e.open(func(c *Config) {
			c.SessionInterval = 10 * time.Second
			if !snapshotIsolation() {
				c.MaxTxAttempts = raceAttempts
			}
		})
		exact(conns[i])
		sessions[i] = e.session(conns[i])
	}
	stop := make(chan struct{})
	var waits atomic.Int64
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			var n int64
			// Waits for another transaction or a row it locked; not for
			// the brief relation extension lock of concurrent inserts.
			_ = e.db.QueryRow(`SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock'
				  AND wait_event IN ('transactionid', 'tuple') AND query LIKE '%INSERT INTO work %'`).Scan(&n)
			waits.Add(n)
		}
	})
	done := make([]atomic.Int64, k)
	errs := make(chan error, k*goroutines)
	var wg sync.WaitGroup
	for i, s := range sessions {
		for range goroutines {
			wg.Go(func() {
				for {
					w, err := s.Work(context.Background(), "install", retrieve)
					switch {
					case errors.Is(err, ErrNothingToDo):
						return
					case errors.Is(err, ErrWorkConflict):
						time.Sleep(time.Millisecond) // the rest is being worked on: look again
						continue
					case err == nil:
						err = w.Finish(context.Background(), tagCommit(w.Machine()))
					}
					if err != nil {
						errs <- err
						return
					}
					done[i].Add(1)
				}
			})
		}
	}
	wg.Wait()
	close(stop)
	sampler.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := e.count("SELECT count(*) FROM tag"); n != machines {
		t.Errorf("%d machines tagged, want %d", n, machines)
	}
	if n := e.count("SELECT count(*) FROM work_history WHERE event = 'Finished'"); n != machines {
		t.Errorf("%d Finished rows, want %d (exactly once)", n, machines)
	}
	// A careless retrieval (these return machines whose end is committing)
	// can make a claim wait for that end on CockroachDB, whose reads wait
	// on intents; cockroach mode does not emulate that.
	if n := waits.Load(); n > 0 {
		t.Errorf("claim statements seen waiting on a lock %d times", n)
	}
	counts, stats := make([]int64, k), make([]Stats, k)
	for i, c := range conns {
		counts[i], stats[i] = done[i].Load(), c.Stats()
		if st := stats[i]; st.TxLockTimeouts != 0 || st.TxDeadlocks != 0 {
			t.Errorf("process %d waited on locks: %+v", i, st)
		}
		t.Logf("process %d: %d machines, stats %+v", i, counts[i], stats[i])
	}
	return counts, stats
}

// raceAttempts is raceProcesses' bound on a transaction's attempts
// without snapshot isolation.
const raceAttempts = 1000

// K processes with several goroutines each, all over the same few
// candidates, in the same order (the worst case: every claim wants the
// first free machine): every machine is finished once, no claim waits on
// another's, and there is no retry storm: on PostgreSQL (snapshot
// isolation) a claim that meets a candidate another process claimed after
// its snapshot looks again with a new snapshot (Stats.ClaimsStale), which
// is no transaction retry, and every process gets machines. (Cockroach
// mode, SERIALIZABLE on PostgreSQL, retries such claims instead.)
func TestProcessesWithTheSameCandidates(t *testing.T) {
	e := newWorkEnv(t)
	const k, goroutines, machines = 4, 3, 160
	for range machines {
		e.machine()
	}
	counts, stats := raceProcesses(t, e, k, goroutines, machines, retrieveUnclaimed)
	var retries, stale int64
	for i, st := range stats {
		retries += st.TxRetries
		stale += st.ClaimsStale
		if snapshotIsolation() && counts[i] == 0 {
			t.Errorf("process %d finished no machine", i)
		}
	}
	if snapshotIsolation() && retries > 0 {
		t.Errorf("%d transaction retries for %d machines, want none", retries, machines)
	}
	if stale > 8*machines {
		t.Errorf("%d stale claim statements for %d machines: a storm", stale, machines)
	}
}

// K processes over the same candidates, each trying them in an order of
// its own (as worker.Loop does): besides the above, no process starves.
// Shares vary with the machine's load (whose batch commits first wins a
// candidate), so starving is less than a quarter of the mean share.
func TestProcessesShareCandidatesFairly(t *testing.T) {
	e := newWorkEnv(t)
	const k, goroutines, machines = 4, 3, 400
	for range machines {
		e.machine()
	}
	shuffled := func(tx *Tx) ([]uuid.UUID, error) {
		ids, err := queryIDs(tx, `SELECT machine_id FROM machines m
			WHERE NOT EXISTS (SELECT 1 FROM tag t WHERE t.machine_id = m.machine_id)
			  AND NOT EXISTS (SELECT 1 FROM work w WHERE w.machine_id = m.machine_id AND w.process = 'install')
			ORDER BY machine_id LIMIT 64`)
		rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		return ids, err
	}
	counts, stats := raceProcesses(t, e, k, goroutines, machines, shuffled)
	t.Logf("machines finished by each process: %v", counts)
	for i, n := range counts {
		if mean := int64(machines / k); snapshotIsolation() && n < mean/4 {
			t.Errorf("process %d finished %d machines, mean %d: starved", i, n, mean)
		}
		if snapshotIsolation() && stats[i].TxRetries > 0 {
			t.Errorf("process %d retried %d transactions, want none", i, stats[i].TxRetries)
		}
	}
}

// snapshotIsolation reports whether the tests' batches run at snapshot
// isolation: on PostgreSQL, not in cockroach mode (whose SERIALIZABLE
// aborts concurrent batches through PostgreSQL's page-level read
// tracking, where CockroachDB's conflicts are per key).
func snapshotIsolation() bool { return !testdb.Cockroach() && !testdb.CockroachMode() }

// retrieveUnclaimed proposes up to 10 machines without a tag and without
// a claim for "install", as a careful application's retrieval does.
func retrieveUnclaimed(tx *Tx) ([]uuid.UUID, error) {
	return queryIDs(tx, `SELECT machine_id FROM machines m
		WHERE NOT EXISTS (SELECT 1 FROM tag t WHERE t.machine_id = m.machine_id)
		  AND NOT EXISTS (SELECT 1 FROM work w WHERE w.machine_id = m.machine_id AND w.process = 'install')
		ORDER BY machine_id LIMIT 10`)
}

// A call whose candidates change between the attempts of its batch (others
// took the first ones meanwhile) has the claim rows of the new ones made
// too, and claims one. Before, a call made claim rows once: the attempt
// after that rerun, offered a new machine without a claim row, returned
// ErrNothingToDo while a free machine waited (seen as a process that
// finished nothing in TestProcessesWithTheSameCandidates).
func TestNewCandidatesAfterARerunGetClaimRows(t *testing.T) {
	e := newWorkEnv(t)
	s := e.session(e.open())
	first, second := e.machine(), e.machine() // neither has a claim row
	var calls atomic.Int32
	w, err := s.Work(context.Background(), "install", func(tx *Tx) ([]uuid.UUID, error) {
		if calls.Add(1) == 1 {
			return []uuid.UUID{first}, nil
		}
		return []uuid.UUID{second}, nil
	})
	if err != nil || w.Machine() != second {
		t.Fatalf("Work with a new candidate after the claim-row rerun = %v, %v; want %s claimed", w, err, second)
	}
	if n := calls.Load(); n < 2 {
		t.Errorf("%d retrievals, want a rerun after the first made claim rows", n)
	}
}
