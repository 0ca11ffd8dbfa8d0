package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/bmdb-dev/bmdb/bmdb"
)

// The matrix (issue 39): bmdb's worker.Loop per item, River with
// transactional jobs (River tx) and the two floors (floors.go), each as K
// OS processes of N/K workers over the same M items, for every N/K of
// -matrix, in interleaved rounds (the systems' order rotating), and beside
// each rate what an item costs: transactions (the server's
// pg_stat_database.xact_commit of the system's database over the run),
// round trips and statements (counted in the processes, rtcount.go), the
// server's CPU time (/proc, servercpu.go) and the processes' own, retries,
// and the least share of a process. Runs, children and their release are
// the procs section's; the exactly-once check runs after every run.

// matrixSystems are the matrix's systems, in run order in round 1.
var matrixSystems = []string{sysBmdb, sysRiverPgxTx, sysFloorItem, sysFloorBatch}

// matrixPoll is how often the parent checks whether a run is done.
const matrixPoll = 5 * time.Millisecond

// matrixRun is one run of one system on one row.
type matrixRun struct {
	procRun
	// Over the run's window (from before "go" to after the processes'
	// backends exited, which flushes their statistics), the system's
	// database's committed and rolled back transactions, less the bench's
	// own (its polls for the end of the run).
	xacts, rollbacks int64
	serverCPU        time.Duration // from "go" to the last item done, less the poller's backend; -1: not known
	clientCPU        time.Duration // the processes', from "go" to "stop"; -1: not known
}

// counts sums the children's round trips and statements.
func (r matrixRun) counts() rtSnapshot {
	out := rtSnapshot{Statements: map[string]int64{}}
	for _, c := range r.children {
		out.RoundTrips += c.Counts.RoundTrips
		out.Socket += c.Counts.Socket
		for k, v := range c.Counts.Statements {
			out.Statements[k] += v
		}
	}
	return out
}

// finalRoundTrips sums the children's round trips until they stopped, by
// lib/pq's protocol and on the socket.
func (r matrixRun) finalRoundTrips() (model, socket int64) {
	for _, c := range r.children {
		model, socket = model+c.Final.RoundTrips, socket+c.Final.Socket
	}
	return model, socket
}

// retries is the run's transactions run again after a serialization
// failure: the floors' 40001s; bmdb's TxRetries and its stale claims
// (ClaimsStale: a candidate claimed or ended after the snapshot, the
// floors' 40001 on a claim).
func (r matrixRun) retries() int64 {
	return r.sum(func(c childResult) int64 { return c.TxRetries + c.ClaimsStale })
}

// poller is the parent's connection to one database, which polls for the
// end of a run; its transactions and CPU time are taken out of the run's.
type poller struct {
	db   *sql.DB
	conn *sql.Conn
	pid  int
}

func openPoller(ctx context.Context, dsn string) (*poller, error) {
	pdsn, err := withParam(dsn, "application_name", "matrix-poller")
	if err != nil {
		return nil, err
	}
	db, err := openPool(pdsn)
	if err != nil {
		return nil, err
	}
	p := &poller{db: db}
	if p.conn, err = db.Conn(ctx); err == nil {
		err = p.conn.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&p.pid)
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	return p, nil
}

func (p *poller) close() {
	p.conn.Close()
	p.db.Close()
}

// flush makes the poller's backend flush its statistics (one transaction).
func (p *poller) flush(ctx context.Context) error {
	_, err := p.conn.ExecContext(ctx, pgStatFlushSQL)
	return err
}

// wait polls q, a boolean query without parameters (one transaction each),
// every matrixPoll until it is true, and returns the number of polls. It
// gives up when failed returns an error.
func (p *poller) wait(ctx context.Context, q string, failed func() error) (int64, error) {
	for n := int64(1); ; n++ {
		var done bool
		if err := p.conn.QueryRowContext(ctx, q).Scan(&done); err != nil {
			return n, fmt.Errorf("waiting for the run to end: %w", err)
		}
		if done {
			return n, nil
		}
		if err := failed(); err != nil {
			return n, err
		}
		select {
		case <-ctx.Done():
			return n, fmt.Errorf("waiting for the run to end: %w", ctx.Err())
		case <-time.After(matrixPoll):
		}
	}
}

// matrixBench is the state of the matrix section.
type matrixBench struct {
	cfg      config
	exe      string
	admin    *sql.DB // the server's DSN's database: reads pg_stat_database and pg_stat_activity
	server   *serverProcs
	bmdbDSN  string
	bmdbDB   *sql.DB
	river    *riverBench
	riverDSN string
	pollers  map[string]*poller // by system's database DSN
	runs     map[procKey][]matrixRun
	checks   []string
}

// runMatrix runs the matrix section and prints its tables.
func runMatrix(ctx context.Context, cfg config, dsn string, conn *bmdb.Connection) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	admin, err := openPool(cfg.dsn)
	if err != nil {
		return err
	}
	defer admin.Close()
	rb, riverDSN, done, err := openRiver(ctx, cfg)
	if err != nil {
		return err
	}
	defer done()
	mb := &matrixBench{
		cfg: cfg, exe: exe, admin: admin, server: findServer(ctx, admin), bmdbDSN: dsn, bmdbDB: conn.DB(),
		river: rb, riverDSN: riverDSN, pollers: map[string]*poller{}, runs: map[procKey][]matrixRun{},
	}
	defer func() {
		for _, p := range mb.pollers {
			p.close()
		}
	}()
	for _, d := range []string{dsn, riverDSN} {
		if mb.pollers[d], err = openPoller(ctx, d); err != nil {
			return err
		}
	}
	cpu := "the server's CPU time from /proc"
	if mb.server == nil {
		cpu = "no server CPU time (the server is not a local process)"
	}
	fmt.Printf("\n== Matrix (issue 39): N workers in all over K OS processes, M=%d items, %d rounds; %s ==\n", cfg.matrixMachines, cfg.rounds, cpu)
	if err := mb.measure(ctx); err != nil {
		return err
	}
	mb.print(os.Stdout)
	return nil
}

// measure runs every system on every row, in cfg.rounds rounds; round r
// starts with the r-th system.
func (mb *matrixBench) measure(ctx context.Context) error {
	for round := 1; round <= mb.cfg.rounds; round++ {
		n := len(mb.cfg.matrixSystems)
		order := append(slices.Clone(mb.cfg.matrixSystems[(round-1)%n:]), mb.cfg.matrixSystems[:(round-1)%n]...)
		for _, row := range mb.cfg.matrix {
			fmt.Fprintf(os.Stderr, "matrix round %d %s:", round, spreadLabel(row))
			for _, sys := range order {
				r, err := mb.run(ctx, sys, row)
				if err != nil {
					fmt.Fprintln(os.Stderr)
					return fmt.Errorf("matrix %s %s: %w", sys, spreadLabel(row), err)
				}
				key := procKey{sys, row}
				mb.runs[key] = append(mb.runs[key], r)
				fmt.Fprintf(os.Stderr, " %s %.0f/s", sys, r.rate())
			}
			fmt.Fprintln(os.Stderr)
		}
	}
	return nil
}

// run seeds, starts row.k children of sys, releases them, times until the
// last item is done, stops them, takes the server's counters and checks
// exactly once.
func (mb *matrixBench) run(ctx context.Context, sys string, row procRow) (matrixRun, error) {
	m := mb.cfg.matrixMachines
	dsn, db, dbName := mb.bmdbDSN, mb.bmdbDB, mb.cfg.bmdbDatabase
	doneSQL := `SELECT NOT EXISTS (SELECT 1 FROM bench_pending ORDER BY seq LIMIT 1)`
	if sys == sysRiverPgxTx {
		dsn, db, dbName = mb.riverDSN, mb.river.db, mb.cfg.riverDatabase
		doneSQL = `SELECT NOT EXISTS (SELECT 1 FROM bench_river_pending ORDER BY job_id LIMIT 1)`
		if err := mb.river.seedJobs(ctx, m, true); err != nil {
			return matrixRun{}, err
		}
	} else if err := seed(ctx, db, m); err != nil {
		return matrixRun{}, err
	}
	if err := flushPool(ctx, db); err != nil {
		return matrixRun{}, err
	}
	children := make([]*child, row.k)
	defer func() {
		for _, c := range children {
			if c != nil {
				c.kill()
			}
		}
	}()
	for i := range children {
		name := fmt.Sprintf("bench-%s-%d", sys, i)
		cdsn, err := withParam(dsn, "application_name", name)
		if err != nil {
			return matrixRun{}, err
		}
		c, err := startChild(ctx, mb.exe, childConfig{
			System: sys, DSN: cdsn, Name: name, Workers: row.n, Lean: leanRetrieval,
			PollMin: mb.cfg.pollMin, PollMax: mb.cfg.pollMax, Cooldown: mb.cfg.riverCooldown,
		})
		if err != nil {
			return matrixRun{}, fmt.Errorf("child %d: %w", i, err)
		}
		children[i] = c
	}
	for i, c := range children {
		if err := c.expect("ready", time.Minute); err != nil {
			return matrixRun{}, fmt.Errorf("child %d: %w", i, err)
		}
	}
	p := mb.pollers[dsn]
	if err := p.flush(ctx); err != nil {
		return matrixRun{}, err
	}
	before, err := mb.xacts(ctx, dbName)
	if err != nil {
		return matrixRun{}, err
	}
	cpu0, pcpu0 := mb.serverCPU(p)

	start := time.Now()
	for _, c := range children {
		if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
			return matrixRun{}, err
		}
		c.watch()
	}
	failed := func() error {
		for i, c := range children {
			if c.ended() {
				_, err := c.result()
				return fmt.Errorf("child %d ended before the run did: %v", i, err)
			}
		}
		return nil
	}
	waitCtx, cancel := context.WithTimeout(ctx, mb.cfg.procsTimeout)
	defer cancel()
	polls, err := p.wait(waitCtx, doneSQL, failed)
	if err != nil {
		return matrixRun{}, err
	}
	out := matrixRun{procRun: procRun{elapsed: time.Since(start), items: m}, serverCPU: -1, clientCPU: 0}
	if cpu1, pcpu1 := mb.serverCPU(p); cpu0 >= 0 && cpu1 >= 0 {
		out.serverCPU = (cpu1 - cpu0) - (pcpu1 - pcpu0)
	}

	for _, c := range children {
		if err := c.sendStop(); err != nil {
			return out, err
		}
	}
	for i, c := range children {
		res, err := c.result()
		if err != nil {
			return out, fmt.Errorf("child %d: %w", i, err)
		}
		out.children = append(out.children, res)
		out.warnings += c.warnings()
		if res.CPU < 0 || out.clientCPU < 0 {
			out.clientCPU = -1
		} else {
			out.clientCPU += res.CPU
		}
		children[i] = nil
	}
	if err := mb.backendsGone(ctx, dbName); err != nil {
		return out, err
	}
	if err := p.flush(ctx); err != nil {
		return out, err
	}
	after, err := mb.xacts(ctx, dbName)
	if err != nil {
		return out, err
	}
	out.xacts = after[0] - before[0] - (polls + 1) // the poller's polls and its flush
	out.rollbacks = after[1] - before[1]
	return out, mb.check(ctx, sys, row, &out)
}

// xacts returns the committed and rolled back transactions of database
// name so far (pg_stat_database, read from the admin database).
func (mb *matrixBench) xacts(ctx context.Context, name string) ([2]int64, error) {
	var x [2]int64
	err := mb.admin.QueryRowContext(ctx, `SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1`, name).Scan(&x[0], &x[1])
	if err != nil {
		return x, fmt.Errorf("reading pg_stat_database: %w", err)
	}
	return x, nil
}

// serverCPU returns the server's CPU time so far and the poller's
// backend's, or -1 if not known.
func (mb *matrixBench) serverCPU(p *poller) (server, poller time.Duration) {
	if mb.server == nil {
		return -1, 0
	}
	s, err := mb.server.cpu()
	if err != nil {
		return -1, 0
	}
	pc, err := backendCPU(p.pid)
	if err != nil {
		return -1, 0
	}
	return s, pc
}

// backendsGone waits until the children's backends of database name have
// exited, having flushed their statistics.
func (mb *matrixBench) backendsGone(ctx context.Context, name string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		err := mb.admin.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name LIKE 'bench-%'`, name).Scan(&n)
		switch {
		case err != nil:
			return fmt.Errorf("reading pg_stat_activity: %w", err)
		case n == 0:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("%d backends of the processes still there 30 s after they exited", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// bmdbCheckSQL is bmdb's exactly-once check in the matrix: machines by
// their number of Finished history rows (one, none, more), those without
// exactly one Started row, and the pending tags and claims left.
const bmdbCheckSQL = `
SELECT count(*) FILTER (WHERE f = 1), count(*) FILTER (WHERE f = 0), count(*) FILTER (WHERE f > 1),
       count(*) FILTER (WHERE s <> 1),
       (SELECT count(*) FROM work_history WHERE process = 'bench'), (SELECT count(*) FROM bench_pending),
       (SELECT count(*) FROM work WHERE process = 'bench')
FROM (
    SELECT count(*) FILTER (WHERE h.event = 'Finished') AS f, count(*) FILTER (WHERE h.event = 'Started') AS s
    FROM machines m LEFT JOIN work_history h ON h.machine_id = m.machine_id AND h.process = 'bench'
    GROUP BY m.machine_id
) c`

// check runs the exactly-once check of a run and records it.
func (mb *matrixBench) check(ctx context.Context, sys string, row procRow, r *matrixRun) error {
	m := mb.cfg.matrixMachines
	worked := r.sum(func(c childResult) int64 { return c.Items })
	ok := worked == int64(m)
	var verdict string
	switch sys {
	case sysRiverPgxTx:
		v, once, err := checkRiver(ctx, mb.river.db, m, true)
		if err != nil {
			return err
		}
		ok, verdict = ok && once, v
	case sysBmdb:
		var c floorCheck
		err := mb.bmdbDB.QueryRowContext(ctx, bmdbCheckSQL).Scan(&c.one, &c.none, &c.many, &c.badStarts, &c.history, &c.pending, &c.claims)
		if err != nil {
			return err
		}
		ok = ok && c.one == m && c.none == 0 && c.many == 0 && c.badStarts == 0 && c.history == 2*m && c.pending == 0 && c.claims == 0
		verdict = c.String()
	default:
		c, once, err := checkFloor(ctx, mb.bmdbDB, m, sys == sysFloorBatch)
		if err != nil {
			return err
		}
		ok, verdict = ok && once, c.String()
		model, socket := r.finalRoundTrips()
		if model != socket {
			ok = false
		}
		verdict += fmt.Sprintf("; round trips by lib/pq's protocol %d, on the socket %d", model, socket)
	}
	line := fmt.Sprintf("%-11s %-22s %s: %d items worked by the processes; %s", sys, spreadLabel(row), map[bool]string{true: "OK", false: "FAILED"}[ok], worked, verdict)
	mb.checks = append(mb.checks, line)
	if !ok {
		return fmt.Errorf("exactly-once check failed: %s", line)
	}
	return nil
}

// median returns the run of sys on row with the median rate.
func (mb *matrixBench) median(sys string, row procRow) (matrixRun, bool) {
	rs := slices.Clone(mb.runs[procKey{sys, row}])
	if len(rs) == 0 {
		return matrixRun{}, false
	}
	slices.SortFunc(rs, func(a, b matrixRun) int { return cmpFloat(a.rate(), b.rate()) })
	return rs[len(rs)/2], true
}

// systemTitles name the systems in the tables.
var systemTitles = map[string]string{
	sysBmdb: "bmdb", sysRiverPgxTx: "River tx", sysFloorItem: "floor item", sysFloorBatch: "floor batch",
}

// print writes the matrix's tables and checks.
func (mb *matrixBench) print(out io.Writer) {
	systems := mb.cfg.matrixSystems
	has := func(s string) bool { return slices.Contains(systems, s) }
	// Items per second, and ratios of each system to River tx and to each floor.
	head := []string{"N", "K"}
	for _, s := range systems {
		head = append(head, systemTitles[s]+"/s")
	}
	type pair struct{ a, b string }
	var pairs []pair
	for _, b := range []string{sysRiverPgxTx, sysFloorItem, sysFloorBatch} {
		for _, a := range []string{sysBmdb, sysRiverPgxTx, sysFloorBatch} {
			if a != b && has(a) && has(b) && !(a == sysFloorBatch && b != sysFloorItem) {
				pairs = append(pairs, pair{a, b})
			}
		}
	}
	for _, p := range pairs {
		head = append(head, systemTitles[p.a]+"/"+systemTitles[p.b])
	}
	fmt.Fprintf(out, "items/s (median of %d rounds) and ratios:\n", mb.cfg.rounds)
	t := newTable(out, head...)
	for _, row := range mb.cfg.matrix {
		cells := []string{fmt.Sprint(row.n * row.k), fmt.Sprint(row.k)}
		rate := map[string]float64{}
		for _, s := range systems {
			r, _ := mb.median(s, row)
			rate[s] = r.rate()
			cells = append(cells, f0(r.rate()))
		}
		for _, p := range pairs {
			cells = append(cells, ratio(rate[p.a], rate[p.b]))
		}
		t.row(cells...)
	}
	t.flush()

	fmt.Fprintln(out, "\nper item, from the median run: transactions (the server's xact_commit of the system's database), round trips, CPU time of the server and of the processes, retries, rollbacks (the server's xact_rollback), least share of a process:")
	t = newTable(out, "N", "K", "system", "items/s", "tx/item", "round trips/item", "server CPU µs/item", "processes' CPU µs/item",
		"retries/item", "rollbacks/item", "least share", "warnings")
	for _, row := range mb.cfg.matrix {
		for _, s := range systems {
			r, _ := mb.median(s, row)
			items := float64(max(r.items, 1))
			perItem := func(d time.Duration) string {
				if d < 0 {
					return "-"
				}
				return f0(float64(d.Microseconds()) / items)
			}
			retries := f2(float64(r.retries()) / items)
			if s == sysRiverPgxTx {
				retries = "-"
			}
			t.row(fmt.Sprint(row.n*row.k), fmt.Sprint(row.k), systemTitles[s], f0(r.rate()), f2(float64(r.xacts)/items),
				f2(float64(r.counts().RoundTrips)/items), perItem(r.serverCPU), perItem(r.clientCPU),
				retries, f2(float64(r.rollbacks)/items), f2(r.share()), fmt.Sprint(r.warnings))
		}
	}
	t.flush()

	for _, s := range systems {
		mb.printStatements(out, s)
	}

	failed := 0
	for _, c := range mb.checks {
		if strings.Contains(c, " FAILED: ") {
			failed++
		}
	}
	fmt.Fprintf(out, "\nexactly-once check after every run: %d runs, %d failed, e.g.\n", len(mb.checks), failed)
	for _, c := range mb.checks[:min(len(systems), len(mb.checks))] {
		fmt.Fprintln(out, "  "+c)
	}
	var model, socket int64
	for _, s := range []string{sysFloorItem, sysFloorBatch} {
		for _, row := range mb.cfg.matrix {
			for _, r := range mb.runs[procKey{s, row}] {
				m, k := r.finalRoundTrips()
				model, socket = model+m, socket+k
			}
		}
	}
	if model > 0 {
		fmt.Fprintf(out, "floors' round trips over all runs: %d by lib/pq's protocol (as bmdb's are counted), %d on the socket\n", model, socket)
	}
}

// printStatements writes what statements an item paid for system s, per
// row: each statement's count (summed over the processes of the row's
// median run) over the items. Statements under 0.005 per item in every row
// are summed as "(other)".
func (mb *matrixBench) printStatements(out io.Writer, s string) {
	rows := mb.cfg.matrix
	per := make([]map[string]float64, len(rows))
	top := map[string]float64{}
	for i, row := range rows {
		r, _ := mb.median(s, row)
		per[i] = map[string]float64{}
		for k, v := range r.counts().Statements {
			x := float64(v) / float64(max(r.items, 1))
			per[i][k] = x
			top[k] = max(top[k], x)
		}
	}
	var labels []string
	for k, x := range top {
		if x >= 0.005 {
			labels = append(labels, k)
		}
	}
	slices.SortFunc(labels, func(a, b string) int { return cmpFloat(top[b], top[a]) })
	head := []string{"statement"}
	for _, row := range rows {
		head = append(head, fmt.Sprintf("%d/%d", row.n*row.k, row.k))
	}
	fmt.Fprintf(out, "\nstatements per item, %s (N/K; prepare and close: of a prepared statement):\n", systemTitles[s])
	t := newTable(out, head...)
	for _, l := range labels {
		cells := []string{l}
		for i := range rows {
			cells = append(cells, f2(per[i][l]))
		}
		t.row(cells...)
	}
	cells := []string{"(other)"}
	for i := range rows {
		other := 0.0
		for k, x := range per[i] {
			if !slices.Contains(labels, k) {
				other += x
			}
		}
		cells = append(cells, f2(other))
	}
	t.row(cells...)
	t.flush()
}
