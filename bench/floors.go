package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/worker"
)

// The floors of the matrix (issue 39): two small lib/pq programs that do
// only the SQL a framework with bmdb's guarantees must do for an item, on
// PostgreSQL, at the isolation bmdb's batches run at there (REPEATABLE
// READ), running the whole transaction again after a serialization failure
// (40001; and a deadlock, 40P01, which their order of locks avoids). A
// claim is a row of floor_work (its primary key (machine, process) is the
// claim, as in bmdb's work table); a pending item is a row of
// bench_pending (the application's tag, as in the bmdb runs); the
// application's write is the deletion of the item's tag (commitSQL, the
// bmdb runs' commit callback).
//
//   - floor-item: each worker, per item, one transaction: BEGIN,
//     floorStepSQL (ends its current item and claims its next in one
//     statement), the application's statement, COMMIT: four round trips,
//     one transaction, one history row (Finished, which carries the claim's
//     start).
//   - floor-batch: bmdb's shape: a process's handlers hand their end and
//     their request for a next item to a batcher, which runs what is
//     waiting in one transaction (up to floorBatches at once, like bmdb's
//     Config.MaxConcurrentBatches): BEGIN, floorStepSQL for all of them,
//     one application statement per ended item, COMMIT: k+3 round trips
//     for k items; a Started and a Finished history row per item, as bmdb
//     writes.
//
// floorStepSQL fuses, on PostgreSQL, the end, the claim and the retrieval
// ("pending and not claimed", which in bmdb is the application's query) in
// one statement (CockroachDB does not allow two data-modifying CTEs on one
// table). It runs first, so that the claims lock right after the
// transaction's snapshot: a claim that meets one committed after it fails
// (first committer wins), and the later its snapshot, the rarer. The floors
// have no session: no liveness check, no takeover of a dead worker's
// claims, no fencing token, no backoff, no fleet controls; their tables
// have no foreign keys and their history one index. Those are bmdb's costs
// above the floors.

// floorSchema is the floors' tables, in the bmdb database beside bench_pending.
const floorSchema = `
CREATE TABLE IF NOT EXISTS floor_work (
    machine_id UUID NOT NULL,
    process TEXT NOT NULL,
    worker TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (machine_id, process)
);
CREATE TABLE IF NOT EXISTS floor_history (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    machine_id UUID NOT NULL,
    process TEXT NOT NULL,
    worker TEXT NOT NULL,
    event TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL,
    at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp()
);
CREATE INDEX IF NOT EXISTS floor_history_machine_idx ON floor_history (machine_id, process);`

// floorStepSQL ends the claims of machines $1 that worker $3 holds for
// process $2 (deletes their claim rows, writes a Finished history row
// each, dated from the claim) and claims up to $4 pending machines without
// a claim of $2, at random among the $6 oldest, skipping those another
// transaction has locked (being claimed or ended), and writes their claim
// rows and, with $5, a Started history row each. It returns how many
// claims it ended and the machines it claimed, one row with a NULL
// machine if none.
//
// Under REPEATABLE READ the claim of a machine that a transaction
// committed after this one's snapshot claimed fails with 40001 (ON
// CONFLICT meets a row the snapshot cannot see): first committer wins. A
// claimer with such a snapshot may have locked the pending row of a
// machine this statement ends: the end locks those rows (ending) before it
// deletes their claims, so that it waits for that claimer, whose insert
// then meets the committed claim and fails at once; deleting the claim
// first would make the claimer wait for this transaction while this one
// waits for its lock (a deadlock, found after deadlock_timeout).
const floorStepSQL = `
WITH ending AS (
    SELECT p.machine_id FROM bench_pending p
    WHERE p.machine_id = ANY ($1::UUID[])
    FOR UPDATE
), ended AS (
    DELETE FROM floor_work w
    USING ending
    WHERE w.machine_id = ending.machine_id AND w.process = $2::TEXT AND w.worker = $3::TEXT
    RETURNING w.machine_id, w.started_at
), next AS (
    SELECT p.machine_id FROM bench_pending p
    WHERE p.machine_id IN (
        SELECT q.machine_id FROM bench_pending q
        WHERE NOT EXISTS (SELECT 1 FROM floor_work w WHERE w.machine_id = q.machine_id AND w.process = $2::TEXT)
        ORDER BY q.seq
        LIMIT $6::INT8
    )
    ORDER BY random()
    LIMIT $4::INT8
    FOR UPDATE OF p SKIP LOCKED
), claimed AS (
    INSERT INTO floor_work (machine_id, process, worker, started_at)
    SELECT next.machine_id, $2::TEXT, $3::TEXT, statement_timestamp() FROM next
    ON CONFLICT DO NOTHING
    RETURNING machine_id, started_at
), history AS (
    INSERT INTO floor_history (machine_id, process, worker, event, started_at)
    SELECT ended.machine_id, $2::TEXT, $3::TEXT, 'Finished', ended.started_at FROM ended
    UNION ALL
    SELECT claimed.machine_id, $2::TEXT, $3::TEXT, 'Started', claimed.started_at FROM claimed WHERE $5::BOOLEAN
)
SELECT (SELECT count(*) FROM ended) AS ended, claimed.machine_id
FROM (SELECT 1) AS one LEFT JOIN claimed ON TRUE`

// floorProcess is the process the floors claim for.
const floorProcess = "bench"

// floorCandidates is how many of the oldest pending machines a floor
// claim picks among at random, as worker.Loop does among the candidates
// of its retrieval (worker.CandidatesDefault, shuffled): claimers that
// all took the oldest would meet on it.
const floorCandidates = worker.CandidatesDefault

// floorBatches is how many batch transactions a floor-batch process runs
// at once (bmdb's Config.MaxConcurrentBatches default when the floors
// were written; it is 1 since).
const floorBatches = 2

// floorChild is one floor process: its pool, its workers (floor-item) or
// handlers and batcher (floor-batch).
type floorChild struct {
	system  string
	name    string
	workers int
	pollMin time.Duration
	pollMax time.Duration
	db      *sql.DB
	step    *sql.Stmt // floorStepSQL
	app     *sql.Stmt // commitSQL

	items   atomic.Int64
	retries atomic.Int64 // transactions run again after a 40001
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	err     error         // guarded by mu: the first worker's failure
	failed  chan struct{} // closed with the first failure

	reqs         chan *floorRequest // floor-batch: handlers to the batcher
	batcherEnded chan struct{}      // floor-batch: closed when the batcher has answered its last request
}

// newFloorChild opens the process's pool (counting round trips into rt,
// at the driver and on the socket), prepares its two statements and makes
// the connections its workers will use, each with them prepared, so that
// the run opens and prepares nothing.
func newFloorChild(ctx context.Context, cfg childConfig, rt *rtCounter) (*floorChild, error) {
	connector, err := pq.NewConnector(cfg.DSN)
	if err != nil {
		return nil, err
	}
	connector.Dialer(&socketDialer{c: rt})
	db := sql.OpenDB(rt.wrap(connector))
	f := &floorChild{
		system: cfg.System, name: cfg.Name, workers: cfg.Workers, pollMin: cfg.PollMin, pollMax: cfg.PollMax, db: db,
		failed: make(chan struct{}),
	}
	conns := cfg.Workers // floor-item: a connection per worker
	if cfg.System == sysFloorBatch {
		conns = floorBatches
	}
	db.SetMaxIdleConns(conns + 1)
	if f.step, err = db.PrepareContext(ctx, floorStepSQL); err == nil {
		f.app, err = db.PrepareContext(ctx, commitSQL)
	}
	if err == nil {
		err = f.warm(ctx, conns)
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	return f, nil
}

// warm opens n connections at once, prepares both statements on each and
// flushes each backend's statistics (pgStatFlushSQL), then leaves them
// idle in the pool.
func (f *floorChild) warm(ctx context.Context, n int) error {
	txs := make([]*sql.Tx, 0, n)
	defer func() {
		for _, tx := range txs {
			_ = tx.Rollback()
		}
	}()
	for range n {
		tx, err := f.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		txs = append(txs, tx)
		for _, st := range []*sql.Stmt{f.step, f.app} {
			if err := tx.StmtContext(ctx, st).Close(); err != nil {
				return err
			}
		}
	}
	for _, tx := range txs {
		if err := tx.Rollback(); err != nil {
			return err
		}
	}
	txs = nil
	return flushPool(ctx, f.db)
}

// start starts the workers. Their transactions run under ctx; stop ends
// their loops and their sleeps (run), not a transaction under way, so
// that every round trip a worker starts is finished when stop returns.
func (f *floorChild) start(ctx context.Context) error {
	run, cancel := context.WithCancel(ctx)
	f.cancel = cancel
	if f.system == sysFloorBatch {
		f.reqs, f.batcherEnded = make(chan *floorRequest, f.workers), make(chan struct{})
		f.wg.Go(func() { f.batcher(ctx, run) })
	}
	for i := range f.workers {
		worker := fmt.Sprintf("%s-%d", f.name, i)
		f.wg.Go(func() {
			var err error
			if f.system == sysFloorBatch {
				err = f.handler(run)
			} else {
				err = f.itemWorker(ctx, run, worker)
			}
			if err != nil {
				f.fail(err)
			}
		})
	}
	return nil
}

// fail records a worker's failure: the process reports it at once
// (runChild), since the item it held will never be done.
func (f *floorChild) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
		close(f.failed)
	}
}

func (f *floorChild) stop(res *childResult) error {
	defer f.db.Close()
	if f.cancel != nil {
		f.cancel()
		f.wg.Wait()
	}
	res.Items, res.TxRetries = f.items.Load(), f.retries.Load()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// poll waits d or until ctx ends, and returns the next wait.
func (f *floorChild) poll(ctx context.Context, d time.Duration) time.Duration {
	t := time.NewTimer(d - rand.N(d/2+1))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return min(2*d, f.pollMax)
}

// itemWorker is a floor-item worker: one transaction per item (under
// ctx), which ends its current item and claims the next, until run ends.
func (f *floorChild) itemWorker(ctx, run context.Context, worker string) error {
	var cur []string // the machine it holds, if any
	wait := f.pollMin
	for run.Err() == nil {
		next, err := f.transact(ctx, cur, worker, 1, false)
		if err != nil {
			return err
		}
		f.items.Add(int64(len(cur)))
		cur = next
		if len(next) == 0 {
			wait = f.poll(run, wait)
		} else {
			wait = f.pollMin
		}
	}
	return nil
}

// transact runs one floor transaction: BEGIN (REPEATABLE READ), the
// application's statement for each machine of ends, floorStepSQL (ends
// them, claims up to want), COMMIT; the whole again after a serialization
// failure (40001) or a deadlock (40P01, which this order avoids: see
// floorStepSQL). It returns the machines claimed.
func (f *floorChild) transact(ctx context.Context, ends []string, worker string, want int, started bool) ([]string, error) {
	for {
		claimed, err := f.attempt(ctx, ends, worker, want, started)
		var pqErr *pq.Error
		if errors.As(err, &pqErr) && (pqErr.Code == "40001" || pqErr.Code == "40P01") {
			f.retries.Add(1)
			continue
		}
		return claimed, err
	}
}

func (f *floorChild) attempt(ctx context.Context, ends []string, worker string, want int, started bool) (_ []string, err error) {
	tx, err := f.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if ends == nil {
		ends = []string{}
	}
	rows, err := tx.StmtContext(ctx, f.step).QueryContext(ctx, ends, floorProcess, worker, want, started, floorCandidates)
	if err != nil {
		return nil, err
	}
	var claimed []string
	var ended int
	for rows.Next() {
		var m uuid.NullUUID
		if err := rows.Scan(&ended, &m); err != nil {
			rows.Close()
			return nil, err
		}
		if m.Valid {
			claimed = append(claimed, m.UUID.String())
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if ended != len(ends) {
		return nil, fmt.Errorf("floor: %d of the %d claims of %s to end were gone", len(ends)-ended, len(ends), worker)
	}
	for _, m := range ends {
		res, err := tx.StmtContext(ctx, f.app).ExecContext(ctx, m)
		if err != nil {
			return nil, err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return nil, fmt.Errorf("floor: machine %s had no pending tag to delete (%d rows, %v)", m, n, err)
		}
	}
	return claimed, tx.Commit()
}

// floorRequest is a floor-batch handler's request: end its machine (if
// any) and claim it a next one.
type floorRequest struct {
	end   string // "" if none
	next  string // the reply: "" if nothing was claimed
	err   error
	ready chan struct{}
}

// handler is a floor-batch handler: it hands its end and its claim of a
// next item to the batcher, and waits for the reply, until run ends.
func (f *floorChild) handler(run context.Context) error {
	cur := ""
	wait := f.pollMin
	for run.Err() == nil {
		r := &floorRequest{end: cur, ready: make(chan struct{})}
		select {
		case f.reqs <- r:
		case <-run.Done():
			return nil
		}
		select {
		case <-r.ready:
		case <-f.batcherEnded:
			return nil // stopped with r queued
		}
		if r.err != nil {
			return r.err
		}
		if cur != "" {
			f.items.Add(1)
		}
		cur = r.next
		if cur == "" {
			wait = f.poll(run, wait)
		} else {
			wait = f.pollMin
		}
	}
	return nil
}

// batcher takes what the handlers have queued and runs it in one
// transaction (under ctx), up to floorBatches transactions at once: while
// they run, requests queue for the next. It stops taking requests when
// run ends.
func (f *floorChild) batcher(ctx, run context.Context) {
	slots := make(chan struct{}, floorBatches)
	var running sync.WaitGroup
	defer func() {
		running.Wait()
		close(f.batcherEnded)
	}()
	for {
		select {
		case slots <- struct{}{}:
		case <-run.Done():
			return
		}
		var batch []*floorRequest
		select {
		case r := <-f.reqs:
			batch = append(batch, r)
		case <-run.Done():
			return
		}
	more:
		for len(batch) < f.workers {
			select {
			case r := <-f.reqs:
				batch = append(batch, r)
			default:
				break more
			}
		}
		running.Go(func() {
			defer func() { <-slots }()
			f.runBatch(ctx, batch)
		})
	}
}

// runBatch runs one floor-batch transaction for batch and replies to each.
func (f *floorChild) runBatch(ctx context.Context, batch []*floorRequest) {
	var ends []string
	for _, r := range batch {
		if r.end != "" {
			ends = append(ends, r.end)
		}
	}
	claimed, err := f.transact(ctx, ends, f.name, len(batch), true)
	for i, r := range batch {
		r.err = err
		if i < len(claimed) {
			r.next = claimed[i]
		}
		close(r.ready)
	}
}

// floorCheckSQL is the floors' exactly-once check: machines by their
// number of Finished history rows (one, none, more), those whose number of
// Started rows is not $1, the history rows, and the pending tags and
// claims left.
const floorCheckSQL = `
SELECT count(*) FILTER (WHERE f = 1), count(*) FILTER (WHERE f = 0), count(*) FILTER (WHERE f > 1),
       count(*) FILTER (WHERE s <> $1::INT8),
       (SELECT count(*) FROM floor_history), (SELECT count(*) FROM bench_pending), (SELECT count(*) FROM floor_work)
FROM (
    SELECT count(*) FILTER (WHERE h.event = 'Finished') AS f, count(*) FILTER (WHERE h.event = 'Started') AS s
    FROM machines m LEFT JOIN floor_history h ON h.machine_id = m.machine_id AND h.process = 'bench'
    GROUP BY m.machine_id
) c`

// floorCheck is the outcome of floorCheckSQL.
type floorCheck struct {
	one, none, many, badStarts, history, pending, claims int
}

// checkFloor runs the floor's exactly-once check after a run of m items
// (started: the floor writes a Started row per claim).
func checkFloor(ctx context.Context, db *sql.DB, m int, started bool) (floorCheck, bool, error) {
	var c floorCheck
	starts, rows := 0, m
	if started {
		starts, rows = 1, 2*m
	}
	err := db.QueryRowContext(ctx, floorCheckSQL, starts).Scan(&c.one, &c.none, &c.many, &c.badStarts, &c.history, &c.pending, &c.claims)
	ok := err == nil && c.one == m && c.none == 0 && c.many == 0 && c.badStarts == 0 && c.history == rows && c.pending == 0 && c.claims == 0
	return c, ok, err
}

func (c floorCheck) String() string {
	return fmt.Sprintf("%d machines with exactly 1 Finished row, %d with none, %d with more, %d with the wrong number of Started rows; %d history rows; %d pending tags and %d claims left",
		c.one, c.none, c.many, c.badStarts, c.history, c.pending, c.claims)
}
