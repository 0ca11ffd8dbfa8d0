// Package chaos is bmdb's fault-injection harness (cmd/bmdb-chaos runs it;
// its README describes the faults and the checks).
//
// It starts a throwaway PostgreSQL cluster, seeds machines, and runs a fleet
// of workers as separate OS processes (the harness binary re-executed in
// worker mode), each with Connections claim loops that claim machines,
// work on them and end each claim with Finish (which commits one effect
// row), Fail or Cancel, recording every operation in a history
// (history.go). Every worker reaches the database through its own TCP
// proxy on 127.0.0.1. While the fleet works, the harness injects faults at
// seeded random times (faults.go).
//
// Afterwards it checks each item's history, the workers' operations joined
// with the database's work_history, against a model of claims with
// porcupine (model.go), and the database and the workers' logs against
// plain rules (checker.go): every item has exactly one effect, committed
// by its claim's Finish before its session's deadline; nothing a session
// wrote committed after its deadline; a dead session's machines were
// worked again, and its claims released, in time (bounds widened by the
// delays the workers measured: sched.go); no item is left stuck. It
// prints the figures and the violations.
package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	_ "github.com/lib/pq" // the harness's own connections

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
	"github.com/bmdb-dev/bmdb/internal/testing/netproxy"
	"github.com/bmdb-dev/bmdb/internal/wait"
)

// Config configures a harness run. CIConfig returns the CI mode's.
type Config struct {
	Seed        uint64
	Workers     int           // worker processes
	Concurrency int           // handlers per loop (worker.Config.Concurrency)
	Connections int           // bmdb Connections per worker process, each with a loop of its own
	Items       int           // items seeded at the start, and per top-up while faults run
	Faults      int           // CI mode: faults to inject, at least one of each kind
	Soak        time.Duration // soak mode when positive: inject faults for this long
	Gap         [2]time.Duration
	Kinds       []FaultKind // the kinds of faults to inject; nil: FaultKinds

	// Serializable runs the workers' batches SERIALIZABLE on PostgreSQL
	// (bmdb.Config.SerializableBatches) rather than at snapshot isolation.
	Serializable bool

	Interval     time.Duration // bmdb session interval of the workers
	GCPeriod     time.Duration // bmdb GC period of the workers
	WorkMin      time.Duration // shortest simulated work per item
	WorkMax      time.Duration // longest simulated work per item
	ReclaimSlack time.Duration // allowed beyond the reclaim and release bounds on an idle machine (transactions take time)
	DrainTimeout time.Duration // how long items may take to finish after the last fault
	Timeout      time.Duration // bounds the whole run

	Repo          string   // repository root, for scripts/pg-start and pg-stop
	PGDir         string   // cluster directory; a new one in the temp dir if empty
	KeepPG        bool     // leave the cluster running (and its directory)
	LogDir        string   // worker logs; a new temp directory if empty
	WorkerCommand []string // argv prefix running one worker, e.g. {exe, "worker"}
	Out           io.Writer
}

// CIConfig returns the CI mode: 4 worker processes, each with 2
// Connections running a loop of 2 handlers, 1 s session
// interval and GC period, a few hundred items, 12 faults (every kind at
// least once), bounded to 6 minutes (a drain on an overloaded machine
// waits longer: drain).
func CIConfig() Config {
	return Config{
		Seed: 1, Workers: 4, Concurrency: 2, Connections: 2, Items: 160, Faults: 12,
		Gap:      [2]time.Duration{500 * time.Millisecond, 2 * time.Second},
		Interval: time.Second, GCPeriod: time.Second,
		WorkMin: 200 * time.Millisecond, WorkMax: 800 * time.Millisecond,
		ReclaimSlack: 500 * time.Millisecond, DrainTimeout: 30 * time.Second, Timeout: 6 * time.Minute,
		Out: os.Stdout,
	}
}

// reclaimBound is how long after its session's deadline a dead claim's
// machine may wait to be worked again, counting only time with free
// machines (reclaim.go), on an idle machine: one interval, as bmdb
// promises, or longer if the fleet's work is. bmdb takes the claim over
// at the first claim statement that meets it among its candidates, and
// a session's claims also sweep every claim of the process held by an
// expired session once per quarter interval; a session claims whenever a
// handler of it is free, at the latest when its work (at most WorkMax)
// is done. So a sweep finds the claim within interval/4 + WorkMax of the
// deadline (1.05 s in CI mode), and the machines it frees are claimed
// first, by it or the next claim. ReclaimSlack covers the transactions.
func (c Config) reclaimBound() time.Duration {
	return max(c.Interval, c.Interval/4+c.WorkMax) + c.ReclaimSlack
}

// releaseBound is how long after its session's deadline a dead claim is
// Abandoned, on an idle machine: by a takeover (as reclaimBound), or by
// GC, which every live session runs every GC period for sessions expired
// more than a grace period (bmdb's default: the interval) ago.
func (c Config) releaseBound() time.Duration { return c.Interval + c.GCPeriod + c.ReclaimSlack }

func (c Config) validate() error {
	switch {
	case c.Workers < 1 || c.Concurrency < 1 || c.Connections < 1 || c.Items < 1:
		return errors.New("chaos: workers, concurrency, connections and items must be positive")
	case c.Soak <= 0 && c.Faults < len(c.kinds()):
		return fmt.Errorf("chaos: CI mode needs at least %d faults, one of each kind", len(c.kinds()))
	case c.Interval < 100*time.Millisecond || c.GCPeriod <= 0:
		return errors.New("chaos: interval must be at least 100ms and GC period positive")
	case c.WorkMin < 0 || c.WorkMax < c.WorkMin:
		return errors.New("chaos: need 0 <= work-min <= work-max")
	case c.Gap[0] < 0 || c.Gap[1] < c.Gap[0]:
		return errors.New("chaos: bad gap between faults")
	case c.Timeout <= 0 || c.DrainTimeout <= 0:
		return errors.New("chaos: timeouts must be positive")
	case len(c.WorkerCommand) == 0:
		return errors.New("chaos: no worker command")
	case c.Repo == "":
		return errors.New("chaos: no repository root (for scripts/pg-start)")
	}
	return nil
}

// kinds returns the kinds of faults to inject.
func (c Config) kinds() []FaultKind {
	if len(c.Kinds) > 0 {
		return c.Kinds
	}
	return FaultKinds
}

// harness is one run's state.
type harness struct {
	cfg            Config
	rng            *rand.Rand
	began          time.Time
	cluster        *Cluster
	db             *sql.DB // the harness's own connections, not through proxies
	fleet          *fleet
	faults         []Fault // appended by the injecting goroutine only
	faultCount     atomic.Int64
	partitionModes map[string]int
	cockroach      bool                 // cockroach mode (crdbmode.EnvVar), which the workers inherit
	stuck          map[uuid.UUID]string // items not done at the end of the drain, and their claim then
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Run runs the harness and returns its report. An error means the harness
// itself could not run; violations are in the report (Report.OK).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	cfg.Out = &lockedWriter{w: cfg.Out} // the injector and the loader both print
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	mode, err := crdbmode.FromEnv()
	if err != nil {
		return nil, err
	}
	h := &harness{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x6368616f73)), began: time.Now(), partitionModes: map[string]int{}, cockroach: mode.Enabled}
	r := &Report{Seed: cfg.Seed, Workers: cfg.Workers, Concurrency: cfg.Concurrency, Connections: cfg.Connections, Interval: cfg.Interval,
		GCPeriod: cfg.GCPeriod, ReclaimBound: cfg.reclaimBound(), ReleaseBound: cfg.releaseBound(), Soak: cfg.Soak,
		Serializable: cfg.Serializable, Cockroach: mode.Enabled}
	err = h.run(ctx, r)
	r.Runtime = time.Since(h.began)
	if err != nil {
		r.Unchecked = err.Error()
	}
	return r, err
}

func (h *harness) run(ctx context.Context, r *Report) error {
	dsn, stop, err := h.setUpDatabase(ctx)
	if stop != nil {
		defer stop()
	}
	if err != nil {
		return err
	}
	defer h.db.Close()
	if err := h.startFleet(dsn); err != nil {
		return err
	}
	r.LogDir = h.fleet.logDir
	fmt.Fprintf(h.cfg.Out, "bmdb-chaos: %d workers up (logs in %s), database %s\n", h.cfg.Workers, h.fleet.logDir, strings.SplitN(dsn, "?", 2)[0])

	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); h.keepLoaded(loadCtx) }()
	err = h.injectAll(ctx)
	stopLoad()
	wg.Wait()
	if err == nil {
		r.DrainExtended = h.drain(ctx)
	}
	for _, s := range h.fleet.stopAll(15 * time.Second) {
		r.violate("%s", s)
	}
	for _, s := range h.fleet.unexpectedExits() {
		r.violate("%s", s)
	}
	for _, p := range h.fleet.procs {
		p.proxy.Close()
	}
	r.Faults, r.PartitionModes = map[FaultKind]int{}, h.partitionModes
	for _, f := range h.faults {
		r.Faults[f.Kind]++
	}
	if err != nil {
		return err
	}
	// The checks read every effect and history row: allow a minute and
	// half the soak's time, so that a long run's larger history is read.
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute+h.cfg.Soak/2)
	defer ccancel()
	return h.check(cctx, r)
}

// setUpDatabase starts the cluster with commit timestamps on, creates and
// migrates the test database, and adds the harness's tables.
func (h *harness) setUpDatabase(ctx context.Context) (dsn string, stop func(), err error) {
	dir := h.cfg.PGDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "bmdb-chaos-pg."); err != nil {
			return "", nil, err
		}
	}
	h.cluster, err = StartCluster(ctx, h.cfg.Repo, dir)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	stop = func() {
		if h.cfg.KeepPG {
			fmt.Fprintf(h.cfg.Out, "bmdb-chaos: PostgreSQL left running in %s (%s); stop it with scripts/pg-stop\n", dir, h.cluster.DSN)
			return
		}
		if err := h.cluster.Stop(); err != nil {
			fmt.Fprintf(h.cfg.Out, "bmdb-chaos: stopping PostgreSQL: %v\n", err)
		}
	}
	admin, err := sql.Open("postgres", h.cluster.DSN)
	if err != nil {
		return "", stop, err
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, enableCommitTSSQL); err != nil {
		return "", stop, fmt.Errorf("chaos: %w", err)
	}
	if err := h.cluster.Restart(ctx); err != nil {
		return "", stop, err
	}
	if _, err := admin.ExecContext(ctx, `CREATE DATABASE bmdb_chaos`); err != nil {
		return "", stop, fmt.Errorf("chaos: creating database: %w", err)
	}
	dsn, err = withParams(h.cluster.DSN, "", "bmdb_chaos", "chaos-harness")
	if err != nil {
		return "", stop, err
	}
	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: "chaos-harness"})
	if err != nil {
		return "", stop, fmt.Errorf("chaos: migrating: %w", err)
	}
	conn.Close()
	if h.db, err = sql.Open("postgres", dsn); err != nil {
		return "", stop, err
	}
	if _, err := h.db.ExecContext(ctx, schemaSQL); err != nil {
		h.db.Close()
		return "", stop, fmt.Errorf("chaos: creating harness tables: %w", err)
	}
	if _, err := h.db.ExecContext(ctx, workerRoleSQL); err != nil {
		h.db.Close()
		return "", stop, fmt.Errorf("chaos: creating the workers' role: %w", err)
	}
	if _, err := h.db.ExecContext(ctx, seedSQL, h.cfg.Items); err != nil {
		h.db.Close()
		return "", stop, fmt.Errorf("chaos: seeding items: %w", err)
	}
	return dsn, stop, nil
}

// startFleet starts one proxy and one worker process per worker.
func (h *harness) startFleet(dsn string) error {
	logDir := h.cfg.LogDir
	if logDir == "" {
		var err error
		if logDir, err = os.MkdirTemp("", "bmdb-chaos-logs."); err != nil {
			return err
		}
	} else if err := os.MkdirAll(logDir, 0o755); err != nil {
		return err
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return err
	}
	h.fleet = &fleet{argv: h.cfg.WorkerCommand, logDir: logDir}
	for id := range h.cfg.Workers {
		proxy, err := netproxy.New(u.Host)
		if err != nil {
			return err
		}
		app := fmt.Sprintf("chaos-w%d", id)
		wdsn, err := withParams(dsn, proxy.Addr(), "", app)
		if err != nil {
			return err
		}
		if wdsn, err = withUser(wdsn, workerRole); err != nil {
			return err
		}
		cfg := WorkerConfig{DSN: wdsn, ID: id, Seed: h.cfg.Seed*100 + uint64(id), Interval: h.cfg.Interval,
			GCPeriod: h.cfg.GCPeriod, Concurrency: h.cfg.Concurrency, Connections: h.cfg.Connections,
			WorkMin: h.cfg.WorkMin, WorkMax: h.cfg.WorkMax, Serializable: h.cfg.Serializable,
			MaxClockOffset: h.clockOffset(id), History: historyPath(logDir, id)}
		if err := h.fleet.add(cfg, app, proxy); err != nil {
			proxy.Close()
			return err
		}
	}
	return nil
}

// clockOffset returns worker id's bmdb.Config.MaxClockOffset: in cockroach
// mode, the limits Open accepts, by turns: half the session interval (a
// session then counts itself dead half an interval after its last
// heartbeat began) and next to none (it relies on the database's deadline
// alone); elsewhere bmdb's default, which PostgreSQL does not use.
func (h *harness) clockOffset(id int) time.Duration {
	switch {
	case !h.cockroach:
		return 0
	case id%2 == 0:
		return h.cfg.Interval / 2
	}
	return time.Millisecond
}

// injectAll injects the CI schedule, or random faults until the soak time
// is over, each after a random gap.
func (h *harness) injectAll(ctx context.Context) error {
	if err := wait.Sleep(ctx, 1500*time.Millisecond); err != nil { // let the fleet get going
		return err
	}
	gap := func() time.Duration {
		return h.cfg.Gap[0] + time.Duration(h.rng.Int64N(int64(h.cfg.Gap[1]-h.cfg.Gap[0])+1))
	}
	if h.cfg.Soak > 0 {
		end := time.Now().Add(h.cfg.Soak)
		for time.Now().Before(end) {
			if err := wait.Sleep(ctx, gap()); err != nil {
				return err
			}
			kinds := h.cfg.kinds()
			if err := h.inject(ctx, kinds[h.rng.IntN(len(kinds))]); err != nil {
				return err
			}
		}
		return nil
	}
	for _, kind := range h.schedule(h.cfg.Faults) {
		if err := wait.Sleep(ctx, gap()); err != nil {
			return err
		}
		if err := h.inject(ctx, kind); err != nil {
			return err
		}
	}
	return nil
}

// keepLoaded adds items whenever fewer than Items/2 are left, so that faults
// always land on a busy fleet, and prints progress every 5 s.
func (h *harness) keepLoaded(ctx context.Context) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	lastPrint := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		total, done, err := h.progress(ctx)
		if err != nil {
			continue // the database may be restarting
		}
		if total-done < h.cfg.Items/2 {
			_, _ = h.db.ExecContext(ctx, seedSQL, h.cfg.Items/2)
		}
		if time.Since(lastPrint) >= 5*time.Second {
			lastPrint = time.Now()
			fmt.Fprintf(h.cfg.Out, "bmdb-chaos: %6.1fs %d of %d items done, %d faults\n", time.Since(h.began).Seconds(), done, total, h.faultCount.Load())
		}
	}
}

func (h *harness) progress(ctx context.Context) (total, done int, err error) {
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err = h.db.QueryRowContext(qctx, progressSQL).Scan(&total, &done)
	return total, done, err
}

// drain waits until every item has an effect, or DrainTimeout (the checker
// then reports the stuck items), longer by the time the machine was
// overloaded meanwhile (drainOverload): a liveness bound, widened as the
// checker widens the others. It returns how much longer it waited.
func (h *harness) drain(ctx context.Context) time.Duration {
	began := time.Now()
	end := began.Add(h.cfg.DrainTimeout)
	var extended time.Duration
	for ctx.Err() == nil {
		if !time.Now().Before(end) {
			more := h.drainOverload(began) - extended
			if more <= 0 || extended+more > maxDrainExtension*h.cfg.DrainTimeout {
				break
			}
			extended += more
			end = end.Add(more)
			fmt.Fprintf(h.cfg.Out, "bmdb-chaos: %6.1fs overloaded for %v of the drain: waiting that much longer\n", time.Since(h.began).Seconds(), extended.Round(time.Millisecond))
		}
		total, done, err := h.progress(ctx)
		if err == nil && done == total {
			fmt.Fprintf(h.cfg.Out, "bmdb-chaos: %6.1fs all %d items done\n", time.Since(h.began).Seconds(), total)
			return extended
		}
		_ = wait.Sleep(ctx, 200*time.Millisecond)
	}
	fmt.Fprintf(h.cfg.Out, "bmdb-chaos: items still not done %v after the last fault\n", h.cfg.DrainTimeout+extended)
	h.stuck = map[uuid.UUID]string{}
	rows, err := h.db.QueryContext(ctx, stuckSQL, Process)
	if err != nil {
		return extended
	}
	defer rows.Close()
	for rows.Next() {
		var m uuid.UUID
		var what string
		if rows.Scan(&m, &what) == nil {
			h.stuck[m] = what
		}
	}
	return extended
}

// maxDrainExtension bounds how many DrainTimeouts drain adds for overload.
const maxDrainExtension = 3

// drainOverload returns how long the machine was overloaded since from, by
// the workers' measurements so far (their histories: delays.overloaded),
// or 0 if they cannot be read now.
func (h *harness) drainOverload(from time.Time) time.Duration {
	ops, err := readHistories(h.fleet.logDir, h.cfg.Workers)
	if err != nil {
		return 0
	}
	offset := realtimeOffset()
	expired, _ := selfExpired(ops, nil, offset, h.cfg.Interval/2)
	return union(newDelays(ops, nil, offset).overloaded(h.cfg.Interval/2), expired).overlap(from, time.Now())
}

// withParams returns the URL dsn with host (if not empty), database (if
// not empty) and application_name replaced.
func withParams(dsn, host, database, app string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", fmt.Errorf("chaos: DSN is not a URL: %w", err)
	}
	if host != "" {
		u.Host = host
	}
	if database != "" {
		u.Path = "/" + database
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// withUser returns the URL dsn with user replaced.
func withUser(dsn, user string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", fmt.Errorf("chaos: DSN is not a URL: %w", err)
	}
	u.User = url.User(user)
	return u.String(), nil
}

// FindRepo returns the repository root above dir: the directory holding
// go.mod and scripts/pg-start.
func FindRepo(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "scripts", "pg-start")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("chaos: no repository root (go.mod and scripts/pg-start) above the working directory")
		}
		dir = parent
	}
}

// Report is a run's figures and violations.
type Report struct {
	Seed                              uint64
	Soak                              time.Duration
	Serializable, Cockroach           bool // the shape: isolation of batches, cockroach mode
	Workers, Concurrency, Connections int
	Interval, GCPeriod                time.Duration
	Runtime                           time.Duration
	LogDir                            string
	Faults                            map[FaultKind]int
	PartitionModes                    map[string]int
	Items, Processed                  int // items seeded, items with an effect
	Effects                           int // effect rows
	Events                            map[string]int
	Reclaims                          []time.Duration // dead sessions' machines: their next Started's commit - the session's final deadline, counting only time with free machines (reclaim.go), sorted
	ReclaimWall                       time.Duration   // the longest of those on the wall clock, all time counted
	ReclaimBound                      time.Duration   // Config.reclaimBound, before what the run measured
	Releases                          []time.Duration // Abandoned at - session's final deadline, sorted
	ReleasedByClaims                  int             // of those, Abandoned rows a claim's transaction wrote (a takeover), not GC or a Close
	ReleaseBound                      time.Duration   // Config.releaseBound, before what the run measured
	SchedDelays                       []time.Duration // the workers' timer lateness, the worst of each window (sched.go), sorted
	RoundTrips                        []time.Duration // the workers' SELECT 1 round trips of pingRecordMin or more (sched.go), sorted
	Connects                          []time.Duration // the workers' probe connections' openings of pingRecordMin or more (sched.go), sorted
	Overloaded                        time.Duration   // how long the delays measured were more than a heartbeat can absorb (delays.overloaded), or a session expired by itself (selfExpired)
	SelfExpired                       int             // sessions that expired with no fault aimed at their worker (selfExpired)
	DrainExtended                     time.Duration   // how much longer than DrainTimeout the drain waited, for overload
	MinCommitMargin                   time.Duration   // least (session deadline - effect commit)
	Operations                        int             // operations checked against the claim model
	Violations                        []string
	// Unchecked, if not empty, is why the run or its checks did not
	// finish: the figures are partial and nothing was verified.
	Unchecked string
}

func (r *Report) violate(format string, args ...any) {
	r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
}

// OK reports whether the run finished its checks and found no violation.
func (r *Report) OK() bool { return len(r.Violations) == 0 && r.Unchecked == "" }

// Print writes the figures and every violation.
func (r *Report) Print(w io.Writer) {
	verdict := "PASS"
	switch {
	case len(r.Violations) > 0:
		verdict = "FAIL"
	case r.Unchecked != "":
		verdict = "INCOMPLETE (not checked: " + r.Unchecked + ")"
	}
	mode := "CI mode"
	if r.Soak > 0 {
		mode = fmt.Sprintf("soak mode (%v)", r.Soak)
	}
	engine, isolation := "plain", "snapshot isolation"
	if r.Cockroach {
		engine = "cockroach mode (max clock offset interval/2 and 1ms by turns)"
	}
	if r.Serializable || r.Cockroach {
		isolation = "SERIALIZABLE"
	}
	fmt.Fprintf(w, "bmdb-chaos: %s: seed %d, %s, %s, %s batches, %d workers x %d connections x %d handlers, interval %v, GC period %v, runtime %v\n",
		verdict, r.Seed, mode, engine, isolation, r.Workers, r.Connections, r.Concurrency, r.Interval, r.GCPeriod, r.Runtime.Round(100*time.Millisecond))
	total, parts := 0, []string{}
	for _, k := range FaultKinds {
		n := r.Faults[k]
		total += n
		if n == 0 {
			continue
		}
		s := fmt.Sprintf("%s %d", k, n)
		if k == FaultPartition {
			s += fmt.Sprintf(" (reset %d, blackhole %d)", r.PartitionModes["reset"], r.PartitionModes["blackhole"])
		}
		parts = append(parts, s)
	}
	fmt.Fprintf(w, "  faults:     %d: %s\n", total, strings.Join(parts, ", "))
	drain := ""
	if r.DrainExtended > 0 {
		drain = fmt.Sprintf(" (the drain waited %v longer: overloaded)", r.DrainExtended.Round(time.Millisecond))
	}
	fmt.Fprintf(w, "  items:      %d seeded, %d processed, %d effect rows%s\n", r.Items, r.Processed, r.Effects, drain)
	var ev []string
	for _, e := range []string{"Started", "Finished", "Abandoned", "Canceled", "Failed"} {
		ev = append(ev, fmt.Sprintf("%s %d", e, r.Events[e]))
	}
	fmt.Fprintf(w, "  claims:     %s\n", strings.Join(ev, ", "))
	if n := len(r.Reclaims); n > 0 {
		fmt.Fprintf(w, "  reclaim:    %d machines of dead sessions worked again after the deadline in max %v, p99 %v, p50 %v, counting time with free machines (wall clock max %v; bound %v +)\n",
			n, r.Reclaims[n-1].Round(time.Millisecond), quantile(r.Reclaims, 0.99).Round(time.Millisecond),
			quantile(r.Reclaims, 0.5).Round(time.Millisecond), r.ReclaimWall.Round(time.Millisecond), r.ReclaimBound)
	} else {
		fmt.Fprintf(w, "  reclaim:    no machine of a dead session\n")
	}
	if n := len(r.Releases); n > 0 {
		fmt.Fprintf(w, "  release:    %d claims of dead sessions released (Abandoned, %d by claims' takeovers, the rest by GC or a Close) after the deadline in max %v, p99 %v, p50 %v (bound %v +)\n",
			n, r.ReleasedByClaims, r.Releases[n-1].Round(time.Millisecond), quantile(r.Releases, 0.99).Round(time.Millisecond),
			quantile(r.Releases, 0.5).Round(time.Millisecond), r.ReleaseBound)
	} else {
		fmt.Fprintf(w, "  release:    no abandoned claims\n")
	}
	fmt.Fprintf(w, "  delays:     timer lateness (worst per %v) %s; round trips %s; connecting %s; overloaded %v (a heartbeat's %d round trips + connecting + lateness >= interval/2, or one of %d sessions expired with no fault aimed at its worker); each bound above + outages and overload + %d x timer lateness + %d x round trip + connecting, the worst measured in its window\n",
		schedWindow, spread(r.SchedDelays), spread(r.RoundTrips), spread(r.Connects), r.Overloaded.Round(time.Millisecond), heartbeatRoundTrips, r.SelfExpired, wakeUps, roundTrips)
	fmt.Fprintf(w, "  deadlines:  closest effect commit %v before its session's deadline\n", r.MinCommitMargin.Round(time.Millisecond))
	fmt.Fprintf(w, "  model:      %d operations checked against the claim model (porcupine), per item\n", r.Operations)
	fmt.Fprintf(w, "  violations: %d\n", len(r.Violations))
	vs := append([]string(nil), r.Violations...)
	sort.Strings(vs)
	for _, v := range vs {
		fmt.Fprintf(w, "    VIOLATION: %s\n", v)
	}
	if r.LogDir != "" {
		fmt.Fprintf(w, "  worker logs: %s\n", r.LogDir)
	}
}

// spread describes sorted ds: max, p99 and p50, or none.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none measured"
	}
	return fmt.Sprintf("max %v, p99 %v, p50 %v", ds[len(ds)-1].Round(time.Millisecond),
		quantile(ds, 0.99).Round(time.Millisecond), quantile(ds, 0.5).Round(time.Millisecond))
}

// quantile returns the q-quantile of sorted ds (nearest rank).
func quantile(ds []time.Duration, q float64) time.Duration {
	i := int(float64(len(ds))*q+0.999999) - 1
	return ds[max(0, min(i, len(ds)-1))]
}
