package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/worker"
)

// childEnv holds a child's childConfig as JSON: a bench process started
// with it set is one "process" of the procs section (procs.go), not the
// bench itself.
const childEnv = "BMDB_BENCH_CHILD"

// Systems a child runs.
const (
	sysBmdb       = "bmdb"
	sysRiverPgx   = "river-pgx"
	sysRiverSQL   = "river-sql"
	sysRiverPgxTx = "river-tx"    // River pgx, each job a transaction (benchTxWorker)
	sysFloorItem  = "floor-item"  // the floor, one transaction per item (floors.go)
	sysFloorBatch = "floor-batch" // the floor, one transaction per batch (floors.go)
)

// childConfig is what the parent tells a child.
type childConfig struct {
	System   string        `json:"system"`
	DSN      string        `json:"dsn"` // with application_name set to Name
	Name     string        `json:"name"`
	Workers  int           `json:"workers"`
	Lean     bool          `json:"lean"`
	PollMin  time.Duration `json:"poll_min"`
	PollMax  time.Duration `json:"poll_max"`
	Cooldown time.Duration `json:"cooldown"`
}

// childResult is what a child reports on its stdout at the end, as one line
// of JSON. Counters cover the run only (from "go" to "stop").
type childResult struct {
	Name  string `json:"name"`
	Items int64  `json:"items"` // machines finished / River jobs completed by this process
	Error string `json:"error,omitempty"`
	// bmdb only: worker.Stats.
	Polls, Claimed, Conflicts, Lost, Failed, NothingToDo, PollSleeps int64
	// bmdb only: bmdb.Connection.Stats.
	TxAttempts, TxRetries, TxCommitRetries, TxConnectionRetries int64
	// bmdb only: Stats.ClaimsStale, claim attempts rerun because another
	// transaction claimed or ended a candidate after their snapshot.
	ClaimsStale int64
	// bmdb only: calls of the application's retrieval, and those that
	// returned no candidate (the transaction then claims nothing: a
	// nothing-to-do result, or one attempt of a retried transaction).
	Retrieves, EmptyRetrieves int64
	// bmdb only: bucket counts of bmdb_claim_duration_seconds (one
	// observation per machine claimed, from the WorkMany call to its
	// return), upper bounds in seconds.
	ClaimBuckets []bucket `json:"claim_buckets,omitempty"`
	// Round trips and statements of the process's connections between
	// "go" and "stop" (rtcount.go). The floors' TxRetries are their
	// transactions run again after a 40001.
	Counts rtSnapshot `json:"counts"`
	// Final is Counts' round trips from "go" until the system stopped, when
	// the floors have finished every round trip they started: there the
	// two counts must agree.
	Final rtSnapshot `json:"final"`
	// CPU is the process's own CPU time (user and system) between "go"
	// and "stop"; -1 where the platform does not say.
	CPU time.Duration `json:"cpu"`
}

// bucket is one cumulative histogram bucket.
type bucket struct {
	Le    float64 `json:"le"`
	Count uint64  `json:"count"`
}

// childMain runs a child: it sets up, prints "ready", waits for a "go" line
// on stdin, works until a "stop" line (or EOF), and prints its result.
func childMain(spec string) {
	var cfg childConfig
	res := childResult{}
	if err := json.Unmarshal([]byte(spec), &cfg); err != nil {
		res.Error = fmt.Sprintf("bad %s: %v", childEnv, err)
	} else {
		res = runChild(cfg, bufio.NewReader(os.Stdin))
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		os.Exit(1)
	}
}

// runChild runs the system of cfg between the parent's "go" and "stop".
func runChild(cfg childConfig, in *bufio.Reader) childResult {
	res := childResult{Name: cfg.Name}
	fail := func(err error) childResult {
		res.Error = err.Error()
		return res
	}
	ctx := context.Background()
	rt := newRTCounter(cfg.DSN)
	var (
		start  func(ctx context.Context) error
		stop   func() error
		failed <-chan struct{} // closed if the system fails before "stop" (nil: never)
	)
	switch cfg.System {
	case sysBmdb:
		b, err := newBmdbChild(ctx, cfg, &res, rt)
		if err != nil {
			return fail(err)
		}
		start, stop, failed = b.start, b.stop, b.done
	case sysRiverPgx, sysRiverSQL, sysRiverPgxTx:
		r, err := newRiverChild(ctx, cfg, &res, rt)
		if err != nil {
			return fail(err)
		}
		start, stop = r.start, r.stop
	case sysFloorItem, sysFloorBatch:
		f, err := newFloorChild(ctx, cfg, rt)
		if err != nil {
			return fail(err)
		}
		start, stop, failed = f.start, func() error { return f.stop(&res) }, f.failed
	default:
		return fail(fmt.Errorf("unknown system %q", cfg.System))
	}
	fmt.Println("ready")
	if line, err := in.ReadString('\n'); err != nil || line != "go\n" {
		_ = stop()
		return fail(fmt.Errorf("waiting for go: %q, %v", line, err))
	}
	before, cpu := rt.snapshot(), processCPU()
	if err := start(ctx); err != nil {
		_ = stop()
		return fail(err)
	}
	stopped := make(chan struct{})
	go func() {
		_, _ = in.ReadString('\n') // "stop", or EOF if the parent died
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-failed:
		// Report at once: the parent stops waiting for the run's end.
	}
	res.Counts = rt.snapshot().since(before)
	res.CPU = -1
	if cpu >= 0 {
		res.CPU = processCPU() - cpu
	}
	if err := stop(); err != nil {
		return fail(err)
	}
	final := rt.snapshot().since(before)
	res.Final = rtSnapshot{RoundTrips: final.RoundTrips, Socket: final.Socket}
	return res
}

// bmdbChild is one bmdb process: a Connection of its own and a
// worker.Loop in its default per-item mode.
type bmdbChild struct {
	conn    *bmdb.Connection
	reg     *prometheus.Registry
	loop    *worker.Loop
	res     *childResult
	before  bmdb.Stats
	cancel  context.CancelFunc
	done    chan struct{} // closed when Run returns
	runErr  error         // what Run returned, once done is closed
	retr    atomic.Int64
	empty   atomic.Int64
	lean    bool
	process string
}

func newBmdbChild(ctx context.Context, cfg childConfig, res *childResult, rt *rtCounter) (*bmdbChild, error) {
	reg := prometheus.NewRegistry()
	metrics, err := bmdb.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	conn, err := bmdb.Open(ctx, bmdb.Config{
		DSN: cfg.DSN, ComponentName: cfg.Name, SkipMigrations: true, Metrics: metrics, WrapConnector: rt.wrap,
	})
	if err != nil {
		return nil, err
	}
	if err := flushPool(ctx, conn.DB()); err != nil {
		conn.Close()
		return nil, err
	}
	b := &bmdbChild{conn: conn, reg: reg, res: res, lean: cfg.Lean, process: "bench", done: make(chan struct{})}
	b.loop, err = worker.New(conn, worker.Config{
		Process:     b.process,
		Concurrency: cfg.Workers,
		Retrieve: func(ctx context.Context, tx *bmdb.Tx, limit int32) ([]uuid.UUID, error) {
			ids, err := query(ctx, tx, b.process, int(limit), 0)
			b.retr.Add(1)
			if err == nil && len(ids) == 0 {
				b.empty.Add(1)
			}
			return ids, err
		},
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			return finishCommit(ctx, w), nil
		},
		PollMin: cfg.PollMin,
		PollMax: cfg.PollMax,
	})
	if err != nil {
		conn.Close()
		return nil, err
	}
	return b, nil
}

func (b *bmdbChild) start(ctx context.Context) error {
	leanRetrieval = b.lean
	b.before = b.conn.Stats()
	ctx, b.cancel = context.WithCancel(ctx)
	go func() {
		defer close(b.done)
		b.runErr = b.loop.Run(ctx)
	}()
	return nil
}

func (b *bmdbChild) stop() error {
	defer b.conn.Close()
	if b.cancel == nil {
		return nil // never started
	}
	b.cancel()
	<-b.done
	ls, cs := b.loop.Stats(), b.conn.Stats()
	r := b.res
	r.Items = ls.Finished
	r.Polls, r.Claimed, r.Conflicts, r.Lost, r.Failed = ls.Polls, ls.Claimed, ls.Conflicts, ls.Lost, ls.Failed
	r.NothingToDo, r.PollSleeps = ls.NothingToDo, ls.PollSleeps
	r.TxAttempts = cs.TxAttempts - b.before.TxAttempts
	r.TxRetries = cs.TxRetries - b.before.TxRetries
	r.TxCommitRetries = cs.TxCommitRetries - b.before.TxCommitRetries
	r.TxConnectionRetries = cs.TxConnectionRetries - b.before.TxConnectionRetries
	r.ClaimsStale = cs.ClaimsStale - b.before.ClaimsStale
	r.Retrieves, r.EmptyRetrieves = b.retr.Load(), b.empty.Load()
	var err error
	r.ClaimBuckets, err = histogramBuckets(b.reg, "bmdb_claim_duration_seconds")
	if b.runErr != nil {
		return fmt.Errorf("worker.Loop.Run: %w", b.runErr)
	}
	return err
}

// histogramBuckets returns the buckets of the histogram name in reg
// (summed over its series).
func histogramBuckets(reg *prometheus.Registry, name string) ([]bucket, error) {
	families, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	var out []bucket
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			out = addBuckets(out, m.GetHistogram())
		}
	}
	return out, nil
}

func addBuckets(into []bucket, h *dto.Histogram) []bucket {
	for i, b := range h.GetBucket() {
		if i >= len(into) {
			into = append(into, bucket{Le: b.GetUpperBound()})
		}
		into[i].Count += b.GetCumulativeCount()
	}
	return into
}

// riverChild is one River process: a client with Workers workers on the
// pgx driver (LISTEN/NOTIFY available) or on database/sql (poll only). On
// pgx its jobs are no-ops (river-pgx) or transactions (river-tx,
// benchTxWorker).
type riverChild struct {
	startClient func(ctx context.Context) error
	stopClient  func(ctx context.Context) error
	close       func()
	res         *childResult
	events      <-chan *river.Event
	cancel      func()
	done        chan struct{}
	started     bool
	items       atomic.Int64
}

func newRiverChild(ctx context.Context, cfg childConfig, res *childResult, rt *rtCounter) (*riverChild, error) {
	rc := &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cfg.Workers}},
		FetchCooldown:     cfg.Cooldown,
		FetchPollInterval: max(cfg.Cooldown, 10*time.Millisecond),
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	r := &riverChild{res: res, done: make(chan struct{})}
	subscribe := &river.SubscribeConfig{
		ChanSize: 1 << 16, Kinds: []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed},
	}
	switch cfg.System {
	case sysRiverPgx, sysRiverPgxTx:
		pcfg, err := pgxpool.ParseConfig(withoutParam(cfg.DSN, "binary_parameters")) // lib/pq's, unknown to pgx
		if err != nil {
			return nil, err
		}
		pcfg.ConnConfig.DialFunc, pcfg.AfterConnect, pcfg.ConnConfig.Tracer = rt.pgxDial, pgxStarted, pgxTally{c: rt}
		workers := river.NewWorkers()
		if cfg.System == sysRiverPgxTx {
			// Each running job holds a connection for its transaction:
			// pgxpool's default MaxConns (max(4, CPUs)) for River's own
			// use, plus one per worker.
			pcfg.MaxConns += int32(cfg.Workers)
		}
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return nil, err
		}
		if cfg.System == sysRiverPgxTx {
			river.AddWorker(workers, benchTxWorker{pool: pool})
		} else {
			river.AddWorker(workers, benchWorker{})
		}
		rc.Workers = workers
		client, err := river.NewClient(riverpgxv5.New(pool), rc)
		if err != nil {
			pool.Close()
			return nil, err
		}
		r.close, r.startClient, r.stopClient = pool.Close, client.Start, client.Stop
		r.events, r.cancel = client.SubscribeConfig(subscribe)
	default:
		db, err := openCountingPool(cfg.DSN, rt)
		if err != nil {
			return nil, err
		}
		workers := river.NewWorkers()
		river.AddWorker(workers, benchWorker{})
		rc.Workers = workers
		rc.PollOnly = true // database/sql has no LISTEN
		client, err := river.NewClient(riverdatabasesql.New(db), rc)
		if err != nil {
			db.Close()
			return nil, err
		}
		r.close, r.startClient, r.stopClient = func() { db.Close() }, client.Start, client.Stop
		r.events, r.cancel = client.SubscribeConfig(subscribe)
	}
	return r, nil
}

func (r *riverChild) start(ctx context.Context) error {
	r.started = true
	go func() {
		defer close(r.done)
		for ev := range r.events {
			if ev.Kind == river.EventKindJobCompleted {
				r.items.Add(1)
			}
		}
	}()
	return r.startClient(ctx)
}

func (r *riverChild) stop() error {
	defer r.close()
	if !r.started {
		r.cancel()
		return nil
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := r.stopClient(stopCtx)
	r.cancel() // closes events
	<-r.done
	r.res.Items = r.items.Load()
	return err
}

// withoutParam removes parameter key from a URL DSN.
func withoutParam(dsn, key string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		return dsn
	}
	q := u.Query()
	q.Del(key)
	u.RawQuery = q.Encode()
	return u.String()
}
