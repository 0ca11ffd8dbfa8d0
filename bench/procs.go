package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/bmdb-dev/bmdb/bmdb"
)

// procRow is one row of the procs table: K processes of N workers each.
type procRow struct{ n, k int }

func (r procRow) String() string { return fmt.Sprintf("N=%d K=%d", r.n, r.k) }

// parseProcRows parses -procs: NxK pairs, e.g. "32x1,32x4".
func parseProcRows(s string) ([]procRow, error) {
	var rows []procRow
	for _, f := range strings.Split(s, ",") {
		var r procRow
		if _, err := fmt.Sscanf(strings.TrimSpace(f), "%dx%d", &r.n, &r.k); err != nil || r.n < 1 || r.k < 1 {
			return nil, fmt.Errorf("%q is not NxK (workers x processes)", f)
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// procRun is one measured run of one system with K child processes.
type procRun struct {
	elapsed  time.Duration
	children []childResult
	items    int
	// bmdb only: committed claim transactions per child (distinct
	// (session, start time) of its Started history rows), i.e. the loop's
	// polls that claimed something.
	claimTxs map[string]int64
	// Warnings the children logged (klog "W" lines), and a few of them.
	warnings int
	samples  []string
	// bmdb with K > 1 only: the errors the server logged, nil if its log
	// could not be read.
	errs *errorTally
}

func (r procRun) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.items) / r.elapsed.Seconds()
}

// sum adds f over the children.
func (r procRun) sum(f func(c childResult) int64) int64 {
	var s int64
	for _, c := range r.children {
		s += f(c)
	}
	return s
}

// perItem is sum(f) per item of the run.
func (r procRun) perItem(f func(c childResult) int64) string {
	return f2(float64(r.sum(f)) / float64(max(r.items, 1)))
}

// share is the fewest items of a child over the mean.
func (r procRun) share() float64 {
	if len(r.children) == 0 {
		return 0
	}
	mean := float64(r.sum(func(c childResult) int64 { return c.Items })) / float64(len(r.children))
	least := slices.MinFunc(r.children, func(a, b childResult) int { return int(a.Items - b.Items) })
	return float64(least.Items) / max(mean, 1)
}

// claimTx returns the committed claim transactions of child c: one Work
// call may commit several (a batch that reruns its stale claims), and
// one transaction serves several calls.
func (r procRun) claimTx(c childResult) int64 { return r.claimTxs[c.Name] }

// sleeps is a child's poll sleeps (worker.Stats.PollSleeps).
func (r procRun) sleeps(c childResult) int64 { return c.PollSleeps }

// nothing is a child's claim calls that returned ErrNothingToDo
// (worker.Stats.NothingToDo).
func (r procRun) nothing(c childResult) int64 { return c.NothingToDo }

// claimP99 is the bucket bound under which 99 % of the run's claims took.
func (r procRun) claimP99() string {
	var all []bucket
	for _, c := range r.children {
		for i, b := range c.ClaimBuckets {
			if i >= len(all) {
				all = append(all, bucket{Le: b.Le})
			}
			all[i].Count += b.Count
		}
	}
	return bucketPct(all, r.sum(func(c childResult) int64 { return c.Claimed }), 99)
}

// bucketPct returns "<=bound" for the first cumulative bucket holding p %
// of total observations.
func bucketPct(bs []bucket, total int64, p float64) string {
	if total == 0 {
		return "-"
	}
	for _, b := range bs {
		if float64(b.Count) >= float64(total)*p/100 {
			return "≤" + ms(time.Duration(b.Le*float64(time.Second)))
		}
	}
	return fmt.Sprintf(">%s", ms(time.Duration(bs[len(bs)-1].Le*float64(time.Second))))
}

// procSystems are the columns of the procs table, in run order.
var procSystems = []string{sysBmdb, sysRiverPgx, sysRiverSQL}

// procKey names the runs of one system in one row.
type procKey struct {
	system string
	row    procRow
}

// procsBench is the state of a section of K-process runs (procs, spread).
type procsBench struct {
	cfg      config
	exe      string
	bmdbDSN  string
	bmdbDB   *sql.DB
	river    *riverBench
	riverDSN string
	section  string               // "procs" or "spread", in progress lines and errors
	systems  []string             // the columns, in run order
	rows     []procRow            // in run order
	label    func(procRow) string // a row's name in progress lines, checks and diagnoses
	runs     map[procKey][]procRun
	checks   []string // of the runs that passed (a failure ends the section)
	waits    map[procRow]*waitTally
}

// newProcsBench opens a fresh River database for a section of K-process
// runs of systems over rows; done closes and drops it.
func newProcsBench(ctx context.Context, cfg config, dsn string, conn *bmdb.Connection, section string,
	systems []string, rows []procRow, label func(procRow) string) (pb *procsBench, done func(), err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	rb, riverDSN, done, err := openRiver(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	return &procsBench{
		cfg: cfg, exe: exe, bmdbDSN: dsn, bmdbDB: conn.DB(), river: rb, riverDSN: riverDSN,
		section: section, systems: systems, rows: rows, label: label,
		runs: map[procKey][]procRun{}, waits: map[procRow]*waitTally{},
	}, done, nil
}

// runProcs measures K OS processes of N workers each, bmdb (worker.Loop,
// one Connection per process) against River (one client per process, on
// its pgx and its database/sql driver), and prints the table and the
// diagnosis of the bmdb runs with K > 1.
func runProcs(ctx context.Context, cfg config, dsn string, conn *bmdb.Connection) error {
	pb, done, err := newProcsBench(ctx, cfg, dsn, conn, "procs", procSystems, cfg.procs, procRow.String)
	if err != nil {
		return err
	}
	defer done()
	fmt.Printf("\n== Processes: K OS processes of N workers each over the same M=%d items, %d rounds ==\n", cfg.machines, cfg.rounds)
	if err := pb.measure(ctx); err != nil {
		return err
	}
	pb.print(os.Stdout)
	return nil
}

// measure runs every system on every row, in cfg.rounds rounds.
func (pb *procsBench) measure(ctx context.Context) error {
	for round := 1; round <= pb.cfg.rounds; round++ {
		for _, row := range pb.rows {
			fmt.Fprintf(os.Stderr, "%s round %d %s:", pb.section, round, pb.label(row))
			for _, sys := range pb.systems {
				r, err := pb.run(ctx, sys, row)
				if err != nil {
					fmt.Fprintln(os.Stderr)
					return fmt.Errorf("%s %s %s: %w", pb.section, sys, pb.label(row), err)
				}
				key := procKey{sys, row}
				pb.runs[key] = append(pb.runs[key], r)
				fmt.Fprintf(os.Stderr, " %s %.0f/s", sys, r.rate())
			}
			fmt.Fprintln(os.Stderr)
		}
	}
	return nil
}

// run seeds, starts row.k children of system sys, releases them at once,
// times until every item is done, collects their results and checks
// exactly once.
func (pb *procsBench) run(ctx context.Context, sys string, row procRow) (procRun, error) {
	cfg := pb.cfg
	db, dsn := pb.bmdbDB, pb.bmdbDSN
	if sys == sysBmdb {
		if err := seed(ctx, db, cfg.machines); err != nil {
			return procRun{}, err
		}
	} else {
		db, dsn = pb.river.db, pb.riverDSN
		if err := pb.river.seedJobs(ctx, cfg.machines, sys == sysRiverPgxTx); err != nil {
			return procRun{}, err
		}
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
			return procRun{}, err
		}
		c, err := startChild(ctx, pb.exe, childConfig{
			System: sys, DSN: cdsn, Name: name, Workers: row.n, Lean: leanRetrieval,
			PollMin: cfg.pollMin, PollMax: cfg.pollMax, Cooldown: cfg.riverCooldown,
		})
		if err != nil {
			return procRun{}, fmt.Errorf("child %d: %w", i, err)
		}
		children[i] = c
	}
	for i, c := range children {
		if err := c.expect("ready", time.Minute); err != nil {
			return procRun{}, fmt.Errorf("child %d: %w", i, err)
		}
	}
	var smp *sampler
	var srvLog *serverLog
	if sys == sysBmdb && row.k > 1 {
		if cfg.sample > 0 {
			if pb.waits[row] == nil {
				pb.waits[row] = newWaitTally(cfg.sample)
			}
			smp = startSampler(db, pb.waits[row])
			defer func() {
				if smp != nil {
					smp.finish()
				}
			}()
		}
		srvLog = openServerLog(ctx, db, cfg.serverLog)
	}
	start := time.Now()
	for _, c := range children {
		if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
			return procRun{}, err
		}
	}
	doneSQL := `SELECT count(*) = 0 FROM bench_pending`
	if sys != sysBmdb {
		doneSQL = fmt.Sprintf(`SELECT count(*) = %d FROM river_job WHERE state = 'completed'`, cfg.machines)
	}
	waitCtx, cancel := context.WithTimeout(ctx, cfg.procsTimeout)
	defer cancel()
	if err := waitUntil(waitCtx, db, doneSQL); err != nil {
		return procRun{}, err
	}
	out := procRun{elapsed: time.Since(start), items: cfg.machines}
	apps, err := backendApps(ctx, db)
	if err != nil {
		return out, err
	}
	if smp != nil {
		smp.finish()
		for pid, app := range smp.apps {
			apps[pid] = app
		}
		smp = nil
	}
	for i, c := range children {
		res, err := c.stop()
		if err != nil {
			return out, fmt.Errorf("child %d: %w", i, err)
		}
		out.children = append(out.children, res)
		out.warnings += c.warnings()
		if len(out.samples) < 3 {
			out.samples = append(out.samples, c.warningSamples(3-len(out.samples))...)
		}
		children[i] = nil
	}
	if srvLog != nil {
		es, err := srvLog.errorsSince(ctx)
		if err != nil {
			return out, fmt.Errorf("reading the server log: %w", err)
		}
		out.errs = &errorTally{}
		out.errs.add(es, apps)
	}
	return out, pb.check(ctx, sys, row, &out)
}

// check runs the exactly-once check of a run and records it.
func (pb *procsBench) check(ctx context.Context, sys string, row procRow, r *procRun) error {
	m := pb.cfg.machines
	worked := r.sum(func(c childResult) int64 { return c.Items })
	var verdict string
	ok := worked == int64(m)
	if sys == sysBmdb {
		chk, err := verify(ctx, pb.bmdbDB, "bench")
		if err != nil {
			return err
		}
		ok = ok && chk.none == 0 && chk.many == 0
		verdict = fmt.Sprintf("%d machines with exactly 1 Finished row, %d with none, %d with more", chk.one, chk.none, chk.many)
		r.claimTxs = map[string]int64{}
		rows, err := pb.bmdbDB.QueryContext(ctx, `
SELECT component_name, count(DISTINCT xmin::text) FROM work_history
WHERE process = 'bench' AND event = 'Started' GROUP BY component_name`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name string
			var n int64
			if err := rows.Scan(&name, &n); err != nil {
				return err
			}
			r.claimTxs[name] = n
		}
		if err := rows.Err(); err != nil {
			return err
		}
	} else {
		v, once, err := checkRiver(ctx, pb.river.db, m, sys == sysRiverPgxTx)
		if err != nil {
			return err
		}
		ok, verdict = ok && once, v
	}
	status := "OK"
	if !ok {
		status = "FAILED"
	}
	pb.checks = append(pb.checks, fmt.Sprintf("%-9s %-10s %s: %d items worked by the processes; %s", sys, pb.label(row), status, worked, verdict))
	if !ok {
		return fmt.Errorf("exactly-once check failed: %d items worked of %d; %s", worked, m, verdict)
	}
	return nil
}

// waitUntil polls the boolean query q until it is true.
func waitUntil(ctx context.Context, db *sql.DB, q string) error {
	for {
		var done bool
		if err := db.QueryRowContext(ctx, q).Scan(&done); err != nil {
			return fmt.Errorf("waiting for the run to end: %w", err)
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the run to end: %w", ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// backendApps maps the backends of db's database to their
// application_name.
func backendApps(ctx context.Context, db *sql.DB) (map[int64]string, error) {
	rows, err := db.QueryContext(ctx, `SELECT pid, application_name FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	apps := map[int64]string{}
	for rows.Next() {
		var pid int64
		var app string
		if err := rows.Scan(&pid, &app); err != nil {
			return nil, err
		}
		apps[pid] = app
	}
	return apps, rows.Err()
}

// withParam sets connection parameter key in dsn (URL or key=value form).
func withParam(dsn, key, value string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parsing DSN: %w", err)
		}
		q := u.Query()
		q.Set(key, value)
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return dsn + " " + key + "=" + value, nil
}

// child is a running copy of the bench in child mode (child.go).
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	stderr bytes.Buffer // read after Wait
	// line, once watch is called, receives the child's result line (or
	// the error reading it): before "stop" only if the child failed.
	line chan lineOrErr
}

type lineOrErr struct {
	line string
	err  error
}

// watch reads the child's result line in the background, so that ended
// can tell whether it has ended before being told to stop.
func (c *child) watch() {
	c.line = make(chan lineOrErr, 1)
	go func() {
		line, err := c.stdout.ReadString('\n')
		c.line <- lineOrErr{line, err}
	}()
}

// ended reports whether a watched child has written its result (or
// closed its stdout): it failed, if it was not told to stop.
func (c *child) ended() bool { return len(c.line) > 0 }

func startChild(ctx context.Context, exe string, cfg childConfig) (*child, error) {
	spec, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	c := &child{cmd: exec.CommandContext(ctx, exe)}
	c.cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	c.cmd.Stderr = &c.stderr
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c.stdout = bufio.NewReader(out)
	return c, c.cmd.Start()
}

// expect waits up to timeout for the line want on the child's stdout.
func (c *child) expect(want string, timeout time.Duration) error {
	got := make(chan string, 1)
	go func() {
		line, _ := c.stdout.ReadString('\n')
		got <- line
	}()
	select {
	case line := <-got:
		if strings.TrimSpace(line) != want {
			c.kill()
			return fmt.Errorf("want %q, got %q; stderr: %s", want, line, c.stderr.String())
		}
		return nil
	case <-time.After(timeout):
		c.kill()
		return fmt.Errorf("no %q after %v", want, timeout)
	}
}

// stop tells the child to stop, reads its result and waits for it.
func (c *child) stop() (childResult, error) {
	if err := c.sendStop(); err != nil {
		return childResult{}, err
	}
	return c.result()
}

// sendStop tells the child to stop: it takes its counters at once, then
// stops.
func (c *child) sendStop() error {
	_, err := io.WriteString(c.stdin, "stop\n")
	return err
}

// resultTimeout bounds how long a watched child may take to stop.
const resultTimeout = time.Minute

// result reads the result of a child told to stop, and waits for it.
func (c *child) result() (childResult, error) {
	var res childResult
	var line string
	var err error
	if c.line != nil {
		select {
		case l := <-c.line:
			line, err = l.line, l.err
		case <-time.After(resultTimeout):
			c.kill()
			return res, fmt.Errorf("no result %v after stop; stderr: %s", resultTimeout, c.stderr.String())
		}
	} else {
		line, err = c.stdout.ReadString('\n')
	}
	if err != nil {
		_ = c.cmd.Wait()
		return res, fmt.Errorf("reading its result: %w; stderr: %s", err, c.stderr.String())
	}
	if err := c.cmd.Wait(); err != nil {
		return res, fmt.Errorf("%w; stderr: %s", err, c.stderr.String())
	}
	if err := json.Unmarshal([]byte(line), &res); err != nil {
		return res, fmt.Errorf("its result %q: %w", line, err)
	}
	if res.Error != "" {
		return res, fmt.Errorf("%s; stderr: %s", res.Error, c.stderr.String())
	}
	return res, nil
}

// kill ends a child that is still running (after a failure).
func (c *child) kill() {
	if c.cmd.ProcessState == nil && c.cmd.Process != nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	}
}

// warnings counts the klog warning lines of the child's stderr.
func (c *child) warnings() int {
	n := 0
	for _, l := range strings.Split(c.stderr.String(), "\n") {
		if strings.HasPrefix(l, "W") {
			n++
		}
	}
	return n
}

// warningSamples returns up to n of the child's warning lines.
func (c *child) warningSamples(n int) []string {
	var out []string
	for _, l := range strings.Split(c.stderr.String(), "\n") {
		if strings.HasPrefix(l, "W") && len(out) < n {
			out = append(out, l)
		}
	}
	return out
}

// medianRun returns the run of key with the median rate.
func (pb *procsBench) medianRun(key procKey) (procRun, bool) {
	rs := slices.Clone(pb.runs[key])
	if len(rs) == 0 {
		return procRun{}, false
	}
	slices.SortFunc(rs, func(a, b procRun) int { return cmpFloat(a.rate(), b.rate()) })
	return rs[len(rs)/2], true
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// print writes the procs table, the exactly-once checks and the diagnosis.
func (pb *procsBench) print(out io.Writer) {
	t := newTable(out, "N", "K", "bmdb items/s", "River pgx/s", "River sql/s", "bmdb/River pgx", "bmdb K/K=1",
		"retries/item", "conflicts/item", "nothing/item", "sleeps/item", "bmdb share", "River pgx share", "River sql share", "claim p99", "warnings")
	for _, row := range pb.rows {
		b, _ := pb.medianRun(procKey{sysBmdb, row})
		rp, _ := pb.medianRun(procKey{sysRiverPgx, row})
		rs, _ := pb.medianRun(procKey{sysRiverSQL, row})
		scale := "-"
		if one, ok := pb.medianRun(procKey{sysBmdb, procRow{row.n, 1}}); ok {
			scale = ratio(b.rate(), one.rate())
		}
		t.row(fmt.Sprint(row.n), fmt.Sprint(row.k), f0(b.rate()), f0(rp.rate()), f0(rs.rate()), ratio(b.rate(), rp.rate()), scale,
			b.perItem(func(c childResult) int64 { return c.TxRetries }), b.perItem(func(c childResult) int64 { return c.Conflicts }),
			b.perItem(b.nothing), b.perItem(b.sleeps), f2(b.share()), f2(rp.share()), f2(rs.share()), b.claimP99(), fmt.Sprint(b.warnings))
	}
	t.flush()
	pb.printChecksAndDiagnoses(out)
}

// printChecksAndDiagnoses writes a few of the exactly-once checks and the
// diagnosis of every row with K > 1.
func (pb *procsBench) printChecksAndDiagnoses(out io.Writer) {
	fmt.Fprintf(out, "exactly-once check after every run: %d runs OK, e.g.\n", len(pb.checks))
	for _, c := range pb.checks[:min(len(pb.systems), len(pb.checks))] {
		fmt.Fprintln(out, "  "+c)
	}
	for _, row := range pb.rows {
		if row.k > 1 {
			pb.diagnose(out, row)
		}
	}
}

// diagnose prints, for the bmdb runs of row, the median run's processes
// and what the sampler and the server log saw over all rounds.
func (pb *procsBench) diagnose(out io.Writer, row procRow) {
	b, ok := pb.medianRun(procKey{sysBmdb, row})
	if !ok {
		return
	}
	fmt.Fprintf(out, "\n-- bmdb %s: the processes of the median run (%.0f items/s) --\n", pb.label(row), b.rate())
	t := newTable(out, "process", "items", "share", "polls", "claim txs", "sleeps", "conflicts", "nothing", "empty retrievals",
		"tx attempts", "retries", "commit retries", "40001", "40P01", "55P03", "other errors", "claim p99")
	mean := float64(b.items) / float64(max(len(b.children), 1))
	for _, c := range b.children {
		txs, sleeps := b.claimTx(c), b.sleeps(c)
		e40, e40p, e55, other := "-", "-", "-", "-"
		if b.errs != nil {
			m := b.errs.byProcess[c.Name]
			e40, e40p, e55 = fmt.Sprint(m["40001"]), fmt.Sprint(m["40P01"]), fmt.Sprint(m["55P03"])
			n := 0
			for code, k := range m {
				if code != "40001" && code != "40P01" && code != "55P03" {
					n += k
				}
			}
			other = fmt.Sprint(n)
		}
		t.row(c.Name, fmt.Sprint(c.Items), f2(float64(c.Items)/max(mean, 1)), fmt.Sprint(c.Polls), fmt.Sprint(txs), fmt.Sprint(sleeps),
			fmt.Sprint(c.Conflicts), fmt.Sprint(b.nothing(c)), fmt.Sprint(c.EmptyRetrieves), fmt.Sprint(c.TxAttempts),
			fmt.Sprint(c.TxRetries), fmt.Sprint(c.TxCommitRetries), e40, e40p, e55, other,
			bucketPct(c.ClaimBuckets, c.Claimed, 99))
	}
	t.flush()
	for _, s := range b.samples {
		fmt.Fprintln(out, "  warning: "+s)
	}
	byCause := map[[2]string]int{}
	read := 0
	for _, r := range pb.runs[procKey{sysBmdb, row}] {
		if r.errs == nil {
			continue
		}
		read++
		for k, v := range r.errs.byCause {
			byCause[k] += v
		}
	}
	if read == 0 {
		fmt.Fprintln(out, "server log not readable (-server-log): no errors by cause")
	} else {
		fmt.Fprintf(out, "errors in the server log over %d runs, by SQLSTATE and failed statement:\n", read)
		if len(byCause) == 0 {
			fmt.Fprintln(out, "  none")
		} else {
			t := newTable(out, "SQLSTATE", "statement", "count")
			for _, k := range topKeys(byCause, 12) {
				t.row(k[0], k[1], fmt.Sprint(byCause[k]))
			}
			t.flush()
		}
	}
	if w := pb.waits[row]; w != nil {
		w.print(out, 12)
	}
}
