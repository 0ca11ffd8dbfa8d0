package claims

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/internal/counters"
	"github.com/bmdb-dev/bmdb/internal/lease"
	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/testing/schema"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
	"github.com/bmdb-dev/bmdb/internal/txn"
)

func TestMain(m *testing.M) {
	os.Exit(testdb.Run(m, schema.Up))
}

// testEngine is a session's engine on a new database, on a pool through
// em (nil: PostgreSQL as it is), with one batch at a time.
type testEngine struct {
	*Engine
	db *sql.DB
}

func newTestEngine(t *testing.T, em *crdbmode.Emulator) *testEngine {
	t.Helper()
	dsn := testdb.New(t)
	var db *sql.DB
	if em != nil {
		conn, err := pq.NewConnector(dsn)
		if err != nil {
			t.Fatal(err)
		}
		db = sql.OpenDB(em.Wrap(conn))
	} else {
		var err error
		if db, err = sql.Open("postgres", dsn); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { db.Close() })
	runner := &txn.Runner{DB: db, Cockroach: em != nil, MaxAttempts: 10, MaxAttemptDuration: -1, Counters: &counters.Counters{}}
	l, err := lease.Start(context.Background(), runner, nil, lease.Config{
		ComponentName: "test", Interval: 10 * time.Second, Lifetime: 10 * time.Second,
		IdleInTransaction: 10 * time.Second, GCPeriod: time.Hour,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _, _ = l.Close(context.Background()) })
	isolation := txn.Snapshot
	if em != nil {
		isolation = txn.Serializable
	}
	e := New(runner, l, Config{ComponentName: "test", MaxBatchSize: 100, MaxConcurrentBatches: 1, Isolation: isolation, Cockroach: em != nil})
	return &testEngine{Engine: e, db: db}
}

// machines makes n machines with claim rows and a controls row for "p".
func (e *testEngine) machines(t *testing.T, n int) []uuid.UUID {
	t.Helper()
	var ids []uuid.UUID
	rows, err := e.db.Query("INSERT INTO machines SELECT gen_random_uuid() FROM generate_series(1, $1) RETURNING machine_id", n)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	for _, q := range []string{
		"INSERT INTO work_fencing (machine_id, process, token) SELECT unnest($1::UUID[]), 'p', 0",
		"INSERT INTO process_controls (process) VALUES ('p') ON CONFLICT DO NOTHING",
	} {
		args := []any{pq.Array(ids)}
		if !strings.Contains(q, "$1") {
			args = nil
		}
		if _, err := e.db.Exec(q, args...); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// goroutine returns the calling goroutine's id, from its stack's header.
func goroutine() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	return string(bytes.Fields(buf)[1])
}

// A lone call runs its batch on its own goroutine: its retrieve and its
// commit run there, with no hand-off to another goroutine.
func TestLoneCallRunsItsOwnBatch(t *testing.T) {
	e := newTestEngine(t, nil)
	ids := e.machines(t, 1)
	caller := goroutine()
	var retrievedOn, committedOn string
	c := &ClaimCall{Limit: 1, Retrieve: func(*txn.Tx) ([]uuid.UUID, error) {
		retrievedOn = goroutine()
		return ids, nil
	}}
	if err := e.Do(context.Background(), "p", c, nil); err != nil || c.Err != nil || len(c.Claims) != 1 {
		t.Fatalf("claim: %v, %v, %v", err, c.Err, c.Claims)
	}
	end := &EndCall{Claim: c.Claims[0], Event: store.WorkHistoryEventFinished, Commit: func(*txn.Tx) error {
		committedOn = goroutine()
		return nil
	}}
	if err := e.Do(context.Background(), "p", nil, end); err != nil || end.Err != nil {
		t.Fatalf("finish: %v, %v", err, end.Err)
	}
	if retrievedOn != caller || committedOn != caller {
		t.Errorf("the caller is goroutine %s; its retrieve ran on %s, its commit on %s", caller, retrievedOn, committedOn)
	}
}

// Calls that wait while a batch runs share the next one: batching forms
// under load, on the goroutine of one of the callers.
func TestWaitingCallsShareABatch(t *testing.T) {
	e := newTestEngine(t, nil)
	ids := e.machines(t, 6)
	release := make(chan struct{})
	let := sync.OnceFunc(func() { close(release) })
	t.Cleanup(let) // a failure below must not leave the first batch blocked
	// The first batch runs once its retrieve does: its attempt has taken
	// the calls it joined then (none but the first), so the five below
	// cannot join it, however late its BEGIN was on a loaded machine.
	retrieving := make(chan struct{})
	var once sync.Once
	first := &ClaimCall{Limit: 1, Retrieve: func(*txn.Tx) ([]uuid.UUID, error) {
		once.Do(func() { close(retrieving) })
		<-release
		return ids[:1], nil
	}}
	var wg sync.WaitGroup
	wg.Go(func() { _ = e.Do(context.Background(), "p", first, nil) })
	select {
	case <-retrieving:
	case <-time.After(30 * time.Second):
		t.Fatal("the first batch did not retrieve within 30s")
	}
	calls := make([]*ClaimCall, 5)
	for i := range calls {
		calls[i] = &ClaimCall{Limit: 1, Retrieve: func(*txn.Tx) ([]uuid.UUID, error) { return ids[1+i : 2+i], nil }}
		wg.Go(func() { _ = e.Do(context.Background(), "p", calls[i], nil) })
	}
	testdb.Eventually(t, 30*time.Second, "the calls to wait", func() bool { return e.Waiting("p") == 5 })
	let()
	wg.Wait()
	var attempts []int64
	rows, err := e.db.Query(`SELECT count(*) FROM work_history WHERE event = 'Started' GROUP BY xmin::text ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n int64
		_ = rows.Scan(&n)
		attempts = append(attempts, n)
	}
	rows.Close()
	// A batch takes in what waits at the start of each attempt: if the
	// first one's attempt failed (a concurrent heartbeat, say) and ran
	// again, the five share its transaction; either way they never split.
	c := e.runner.Counters
	retried := c.Attempts.Load() > 2
	if !slices.Equal(attempts, []int64{1, 5}) && !(retried && slices.Equal(attempts, []int64{6})) {
		t.Errorf("claims per transaction = %v (%d attempts, %d retried for serialization, %d for connections), want the lone first one, then the five that waited together",
			attempts, c.Attempts.Load(), c.Retries[counters.RetrySerialization].Load(), c.Retries[counters.RetryConnection].Load())
	}
}

// A write after the statement that checked the session last (here a
// Cancel's WorkEndMany after the claim statement, in one batch) is
// followed by the check before COMMIT, by itself: the transaction type
// knows a statement ran since the last check. What counts is the attempt
// that committed: one that failed before it (a heartbeat of the session
// that committed after its snapshot, say) ran again from its retrieve.
func TestWriteAfterTheClaimStatementGetsTheCheck(t *testing.T) {
	em := crdbmode.New(crdbmode.Settings{Enabled: true}, nil)
	em.Off()
	var mu sync.Mutex
	var names []string
	em.Hook(func(query string) error {
		if name, ok := strings.CutPrefix(query, "-- name: "); ok {
			mu.Lock()
			names = append(names, strings.Fields(name)[0])
			mu.Unlock()
		}
		return nil
	})
	e := newTestEngine(t, em)
	ids := e.machines(t, 2)
	held := &ClaimCall{Limit: 1, Retrieve: func(*txn.Tx) ([]uuid.UUID, error) { return ids[:1], nil }}
	if err := e.Do(context.Background(), "p", held, nil); err != nil || held.Err != nil {
		t.Fatal(err, held.Err)
	}
	q := e.queue("p")
	// Each attempt of the batch begins with the claim's retrieve: it
	// marks where the attempt's statements start.
	const attemptStarts = "(retrieve)"
	claim := &request{ctx: context.Background(), claim: &ClaimCall{Limit: 1, Retrieve: func(*txn.Tx) ([]uuid.UUID, error) {
		mu.Lock()
		names = append(names, attemptStarts)
		mu.Unlock()
		return ids[1:], nil
	}}, done: make(chan struct{})}
	cancel := &request{ctx: context.Background(), end: &EndCall{Claim: held.Claims[0], Event: store.WorkHistoryEventCanceled}, done: make(chan struct{})}
	mu.Lock()
	names = nil
	mu.Unlock()
	q.runBatch([]*request{claim, cancel}, false)
	if claim.err != nil || claim.claim.Err != nil || len(claim.claim.Claims) != 1 || cancel.err != nil || cancel.end.Err != nil {
		t.Fatalf("the batch: %v %v %v, %v %v", claim.err, claim.claim.Err, claim.claim.Claims, cancel.err, cancel.end.Err)
	}
	mu.Lock()
	defer mu.Unlock()
	began, last := 0, -1
	for i, name := range names {
		if name == attemptStarts {
			began, last = began+1, i
		}
	}
	if began == 0 || began != claim.batch.Attempts {
		t.Fatalf("the batch's statements = %v: %d attempts began, the batch counted %d", names, began, claim.batch.Attempts)
	}
	want := []string{"WorkClaimManyArbitrated", "WorkEndMany", "SessionCheckBeforeCommit"}
	if committed := names[last+1:]; !slices.Equal(committed, want) {
		t.Errorf("the committed attempt's statements = %v (all: %v), want %v: the check before COMMIT after the Cancel's write", committed, names, want)
	}
}

// However calls arrive, every runner's place is given back once: after
// many concurrent calls, none runs and none waits. (A call handed a
// place while another batch had taken it once gave the place back on
// every wake-up until its reply.)
func TestRunnersPlacesBalance(t *testing.T) {
	e := newTestEngine(t, nil)
	e.cfg.MaxConcurrentBatches = 2
	ids := e.machines(t, 40)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			c := &ClaimCall{Limit: 1, Retrieve: func(*txn.Tx) ([]uuid.UUID, error) { return ids[i : i+1], nil }}
			if err := e.Do(context.Background(), "p", c, nil); err != nil || c.Err != nil {
				t.Errorf("claim %d: %v, %v", i, err, c.Err)
				return
			}
			end := &EndCall{Claim: c.Claims[0], Event: store.WorkHistoryEventCanceled}
			if err := e.Do(context.Background(), "p", nil, end); err != nil || end.Err != nil {
				t.Errorf("cancel %d: %v, %v", i, err, end.Err)
			}
		})
	}
	wg.Wait()
	q := e.queue("p")
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.runners != 0 || len(q.waiting) != 0 {
		t.Errorf("after every call returned: %d runners, %d waiting; want none", q.runners, len(q.waiting))
	}
}

// A call handed a runner's place (release) whose request another batch
// then took, before the call woke, gives the place back once, not on
// every wake-up until its reply.
func TestHandedPlaceGivenBackOnce(t *testing.T) {
	q := &queue{e: &Engine{cfg: Config{MaxBatchSize: 10, MaxConcurrentBatches: 1}}, process: "p", runners: 1}
	r := &request{}
	returned := make(chan error, 1)
	go func() { returned <- q.do(context.Background(), r) }()
	testdb.Eventually(t, 5*time.Second, "the call to wait", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.waiting) == 1
	})
	q.release() // the place goes to r ...
	q.mu.Lock()
	r.taken = true // ... which another batch takes before r's caller wakes
	q.waiting = nil
	q.mu.Unlock()
	time.Sleep(50 * time.Millisecond) // not a wait for an outcome: the time r's caller has to wake, run nothing and give the place back
	close(r.done)                     // the other batch replies
	if err := <-returned; err != nil {
		t.Fatal(err)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.runners != 0 {
		t.Errorf("%d runners after the handed place was given back, want 0", q.runners)
	}
}

// A batch's span costs nothing without a tracer: starting, linking the
// calls that join and ending it allocate nothing.
func TestBatchSpanOffAllocatesNothing(t *testing.T) {
	q := &queue{e: &Engine{}, process: "install"}
	reqs := []*request{{ctx: context.Background()}, {ctx: context.Background(), end: &EndCall{}}}
	allocs := testing.AllocsPerRun(100, func() {
		_, span := q.startBatch(context.Background(), reqs)
		linkJoined(span, reqs, 1)
		endBatch(span, reqs, 1, ErrWorkLost)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per batch without a tracer, want 0", allocs)
	}
}
