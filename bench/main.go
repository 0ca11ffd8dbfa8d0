// Command bench measures bmdb's claim cycle against the database's floor
// (two small SERIALIZABLE transactions per item) and River, and runs a scale
// and a contention benchmark. See README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bmdb-dev/bmdb/bmdb"
)

type config struct {
	dsn             string
	machines        int
	workers         []int
	rounds          int
	pick            pick
	candidates      int
	batch           int
	scale           []int
	scaleClaims     int
	contentionItems int
	riverCooldown   time.Duration
	only            map[string]bool
	keep            bool
	procs           []procRow
	spread          []procRow // the processes of each spread row: N/K workers each
	matrix          []procRow // the processes of each matrix row: N/K workers each
	matrixSystems   []string
	matrixMachines  int
	pollMin         time.Duration
	pollMax         time.Duration
	sample          time.Duration
	serverLog       string
	procsTimeout    time.Duration
	bmdbDatabase    string // the databases the bench creates (-db-prefix)
	riverDatabase   string
}

func parseFlags() (config, error) {
	var c config
	var workers, scale, only, pk, procs, spread, matrix, matrixSys, dbPrefix string
	quick := flag.Bool("quick", false, "the quick run of make bench: -machines 2000 -matrix-machines 1000 -scale 10000,100000 -scale-claims 300 -contention-items 300 (explicit flags win)")
	flag.StringVar(&c.dsn, "dsn", "", "PostgreSQL DSN of a user that may create databases (default $BMDB_DSN)")
	flag.IntVar(&c.machines, "machines", 10000, "M: machines (and River jobs) per throughput run")
	flag.StringVar(&workers, "workers", "1,8,32", "N: worker counts of the throughput table")
	flag.IntVar(&c.rounds, "rounds", 3, "rounds of the throughput table, interleaving floor, bmdb and River; the median is reported")
	flag.StringVar(&pk, "pick", string(pickShuffle), "how bmdb workers choose among candidates: first, shuffle or offset")
	flag.IntVar(&c.candidates, "candidates", 16, "candidates per retrieval (and the offset range of -pick offset)")
	flag.IntVar(&c.batch, "batch", 32, "machines per WorkMany and batched Finishes (one SharedCommit) in the bmdb batch column (1: no batch column)")
	flag.StringVar(&scale, "scale", "10000,1000000", "machine counts of the scale run")
	flag.IntVar(&c.scaleClaims, "scale-claims", 1000, "claim cycles measured per scale size")
	flag.IntVar(&c.contentionItems, "contention-items", 2000, "machines claimed one at a time by 32 workers in the contention run")
	flag.DurationVar(&c.riverCooldown, "river-cooldown", time.Millisecond, "River's FetchCooldown (its default is 100ms, which caps its throughput)")
	flag.StringVar(&only, "only", "table,picks,scale,contention,matrix,cap", "sections to run: table, picks, scale, contention, matrix, spread, procs, cap")
	flag.StringVar(&matrix, "matrix", "1/1,8/1,8/2,8/4,8/8,32/1,32/2,32/4,32/8", "rows of the matrix section: N/K, N workers in all over K OS processes (N/K each; K must divide N)")
	flag.StringVar(&matrixSys, "matrix-systems", strings.Join(matrixSystems, ","), "systems of the matrix section, in run order: bmdb, river-tx, floor-item, floor-batch")
	flag.IntVar(&c.matrixMachines, "matrix-machines", 6000, "M: items per matrix run")
	flag.StringVar(&spread, "spread", "8/1,8/2,8/4,8/8,32/1,32/2,32/4,32/8", "rows of the spread section: N/K, N workers in all over K OS processes (N/K each; K must divide N)")
	flag.StringVar(&procs, "procs", "32x1,32x2,32x4,32x8,8x1,8x4", "rows of the procs section: NxK, K OS processes of N workers each")
	flag.DurationVar(&c.pollMin, "poll-min", time.Millisecond, "worker.Config.PollMin of the spread and procs sections' bmdb processes")
	flag.DurationVar(&c.pollMax, "poll-max", 16*time.Millisecond, "worker.Config.PollMax of the spread and procs sections' bmdb processes")
	flag.DurationVar(&c.sample, "sample", 100*time.Millisecond, "pg_stat_activity sampling interval during bmdb runs with K > 1 (0: off)")
	flag.StringVar(&c.serverLog, "server-log", "", "server log file to count errors by SQLSTATE in, read with pg_read_file (default: scripts/pg-start's server.log beside the data directory; off: none)")
	flag.DurationVar(&c.procsTimeout, "procs-timeout", 5*time.Minute, "longest a spread or procs run may take")
	flag.BoolVar(&c.keep, "keep", false, "keep the bench databases afterwards")
	flag.StringVar(&dbPrefix, "db-prefix", "", "prefix of the databases the bench creates ("+bmdbDatabase+", "+riverDatabase+"), so that two runs can share a server")
	retrieval := flag.String("retrieval", "full", "bmdb retrieval: full (excludes claimed machines and backoff, as most applications write it) or lean (pending machines only; Work skips the rest)")
	flag.Parse()
	switch *retrieval {
	case "full":
	case "lean":
		leanRetrieval = true
	default:
		fmt.Fprintf(os.Stderr, "bench: -retrieval %q: want full or lean\n", *retrieval)
		os.Exit(2)
	}
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *quick {
		for name, v := range map[string]string{"machines": "2000", "matrix-machines": "1000", "scale": "10000,100000", "scale-claims": "300", "contention-items": "300"} {
			if !set[name] {
				flag.Set(name, v)
			}
		}
		workers, scale = flag.Lookup("workers").Value.String(), flag.Lookup("scale").Value.String()
	}
	var err error
	if c.workers, err = ints(workers); err != nil {
		return c, fmt.Errorf("-workers: %w", err)
	}
	if c.scale, err = ints(scale); err != nil {
		return c, fmt.Errorf("-scale: %w", err)
	}
	if c.procs, err = parseProcRows(procs); err != nil {
		return c, fmt.Errorf("-procs: %w", err)
	}
	if c.spread, err = parseSpreadRows(spread); err != nil {
		return c, fmt.Errorf("-spread: %w", err)
	}
	if c.matrix, err = parseSpreadRows(matrix); err != nil {
		return c, fmt.Errorf("-matrix: %w", err)
	}
	for _, s := range strings.Split(matrixSys, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(matrixSystems, s) || slices.Contains(c.matrixSystems, s) {
			return c, fmt.Errorf("-matrix-systems: %q is not one of %s, or named twice", s, strings.Join(matrixSystems, ", "))
		}
		c.matrixSystems = append(c.matrixSystems, s)
	}
	if c.matrixMachines < 1 {
		return c, fmt.Errorf("-matrix-machines %d: want at least 1", c.matrixMachines)
	}
	if strings.Trim(dbPrefix, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
		return c, fmt.Errorf("-db-prefix %q: want lower-case letters, digits and _", dbPrefix)
	}
	c.bmdbDatabase, c.riverDatabase = dbPrefix+bmdbDatabase, dbPrefix+riverDatabase
	c.pick = pick(pk)
	if !slices.Contains([]pick{pickFirst, pickShuffle, pickOffset}, c.pick) {
		return c, fmt.Errorf("-pick %q: want first, shuffle or offset", pk)
	}
	c.only = map[string]bool{}
	for _, s := range strings.Split(only, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains([]string{"table", "picks", "scale", "contention", "matrix", "spread", "procs", "cap"}, s) {
			return c, fmt.Errorf("-only: unknown section %q", s)
		}
		c.only[s] = true
	}
	if c.dsn == "" {
		c.dsn = os.Getenv("BMDB_DSN") // not the flag's default: -help would print its password
	}
	if c.dsn == "" {
		return c, fmt.Errorf("no database: set -dsn or BMDB_DSN (make bench starts a throwaway PostgreSQL)")
	}
	return c, nil
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func main() {
	if spec, ok := os.LookupEnv(childEnv); ok {
		childMain(spec)
		return
	}
	cfg, err := parseFlags()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// Databases the bench creates on the server (and drops unless -keep),
// after -db-prefix.
const (
	bmdbDatabase  = "bmdb_bench"
	riverDatabase = "bmdb_bench_river"
)

func run(ctx context.Context, cfg config) error {
	start := time.Now()
	dsn, err := freshDatabase(ctx, cfg.dsn, cfg.bmdbDatabase)
	if err != nil {
		return err
	}
	if !cfg.keep {
		defer dropDatabase(context.Background(), cfg.dsn, cfg.bmdbDatabase)
	}
	conn, err := bmdb.Open(ctx, bmdb.Config{DSN: dsn, ComponentName: "bench"})
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.DB().ExecContext(ctx, benchSchema); err != nil {
		return fmt.Errorf("bench schema: %w", err)
	}
	fmt.Printf("bmdb bench: M=%d machines, N=%v workers, %d rounds, pick=%s/%d, lean retrieval=%v, River FetchCooldown=%v\n",
		cfg.machines, cfg.workers, cfg.rounds, cfg.pick, cfg.candidates, leanRetrieval, cfg.riverCooldown)
	if cfg.only["table"] {
		if err := runTable(ctx, cfg, dsn, conn); err != nil {
			return err
		}
	}
	if cfg.only["picks"] {
		if err := runPicks(ctx, cfg, conn); err != nil {
			return err
		}
	}
	if cfg.only["scale"] {
		fmt.Printf("\n== Scale: %d claim cycles by 1 worker per size ==\n", cfg.scaleClaims)
		var rs []scaleResult
		for _, size := range cfg.scale {
			r, err := runScale(ctx, conn, size, cfg.scaleClaims)
			if err != nil {
				return fmt.Errorf("scale %d: %w", size, err)
			}
			rs = append(rs, r)
		}
		printScale(os.Stdout, rs)
	}
	if cfg.only["contention"] {
		fmt.Printf("\n== Contention: 32 workers, %d machines, 1 claimable at a time ==\n", cfg.contentionItems)
		c, err := runContention(ctx, conn, 32, cfg.contentionItems)
		if err != nil {
			return fmt.Errorf("contention: %w", err)
		}
		printContention(os.Stdout, c)
	}
	if cfg.only["procs"] {
		if err := runProcs(ctx, cfg, dsn, conn); err != nil {
			return err
		}
	}
	if cfg.only["spread"] {
		if err := runSpread(ctx, cfg, dsn, conn); err != nil {
			return err
		}
	}
	if cfg.only["matrix"] {
		if err := runMatrix(ctx, cfg, dsn, conn); err != nil {
			return err
		}
	}
	if cfg.only["cap"] {
		if err := runCap(ctx, cfg, dsn, conn); err != nil {
			return err
		}
	}
	fmt.Printf("\nbench done in %v\n", time.Since(start).Round(time.Second))
	return nil
}

// runTable measures floor, bmdb and River for every worker count, in
// interleaved rounds, and prints medians and ratios.
func runTable(ctx context.Context, cfg config, dsn string, conn *bmdb.Connection) error {
	rb, _, done, err := openRiver(ctx, cfg)
	if err != nil {
		return err
	}
	defer done()
	db := conn.DB()
	floor, bm, bb, rv := map[int][]result{}, map[int][]result{}, map[int][]result{}, map[int][]result{}
	loop, loopGroup, loop2 := map[int][]result{}, map[int][]result{}, map[int][]result{}
	var checks []string
	for round := 1; round <= cfg.rounds; round++ {
		for _, n := range cfg.workers {
			if err := seed(ctx, db, cfg.machines); err != nil {
				return err
			}
			r, err := runFloor(ctx, dsn, db, n)
			if err != nil {
				return err
			}
			floor[n] = append(floor[n], r)
			fmt.Fprintf(os.Stderr, "round %d N=%d floor %.0f/s", round, n, r.rate())

			// measure runs one bmdb column, keeps its result and its
			// exactly-once check, and prints its rate.
			measure := func(into map[int][]result, checkLabel, rateLabel string, run func() (result, check, error)) error {
				r, chk, err := run()
				if err != nil {
					return err
				}
				into[n] = append(into[n], r)
				checks = append(checks, fmt.Sprintf("round %d N=%-2d %s%s", round, n, checkLabel, chk))
				fmt.Fprintf(os.Stderr, ", %s %.0f/s", rateLabel, r.rate())
				return nil
			}
			err = measure(bm, "", "bmdb", func() (result, check, error) {
				return bmdbOnce(ctx, conn, cfg.machines, n, cfg.pick, cfg.candidates, 1)
			})
			if err != nil {
				return err
			}
			if cfg.batch > 1 {
				err := measure(bb, fmt.Sprintf("batch %d ", cfg.batch), "bmdb batch", func() (result, check, error) {
					return bmdbOnce(ctx, conn, cfg.machines, n, cfg.pick, max(cfg.candidates, 2*cfg.batch), cfg.batch)
				})
				if err != nil {
					return err
				}
			}

			loops := []struct {
				into  map[int][]result
				label string
				procs int
				group bool
			}{
				{loop, "loop", 1, false},
				{loopGroup, "loop with CommitShared", 1, true},
				{loop2, "loop 2 processes", 2, false},
			}
			for _, l := range loops {
				if l.procs > n {
					continue
				}
				err := measure(l.into, l.label+" ", l.label, func() (result, check, error) {
					r, chk, err := loopOnce(ctx, dsn, cfg.machines, n, l.procs, l.group)
					if err != nil {
						return r, chk, fmt.Errorf("worker.Loop N=%d, %s: %w", n, l.label, err)
					}
					return r, chk, nil
				})
				if err != nil {
					return err
				}
			}

			if r, err = rb.run(ctx, cfg.machines, n); err != nil {
				return err
			}
			rv[n] = append(rv[n], r)
			fmt.Fprintf(os.Stderr, ", River %.0f/s\n", r.rate())
		}
	}
	fmt.Printf("\n== Throughput: M=%d items, median of %d rounds ==\n", cfg.machines, cfg.rounds)
	t := newTable(os.Stdout, "N", "floor items/s", "bmdb items/s", "River jobs/s", "bmdb/floor", "bmdb/River",
		"bmdb tx/item", "retries", "conflicts", "claim p50", "claim p99")
	for _, n := range cfg.workers {
		f, b, r := median(floor[n]), median(bm[n]), median(rv[n])
		t.row(fmt.Sprint(n), f0(f.rate()), f0(b.rate()), f0(r.rate()), ratio(b.rate(), f.rate()), ratio(b.rate(), r.rate()),
			f2(float64(b.attempts)/float64(max(b.items, 1))), fmt.Sprint(b.retries), fmt.Sprint(b.conflicts),
			ms(b.claims.pct(50)), ms(b.claims.pct(99)))
	}
	t.flush()
	if cfg.batch > 1 {
		fmt.Printf("\n== Throughput with batches: WorkMany and batched Finishes of %d machines, M=%d, median of %d rounds ==\n", cfg.batch, cfg.machines, cfg.rounds)
		t := newTable(os.Stdout, "N", "floor items/s", "batch items/s", "River jobs/s", "batch/floor", "batch/River",
			"tx/item", "retries", "claim p50", "claim p99")
		for _, n := range cfg.workers {
			f, b, r := median(floor[n]), median(bb[n]), median(rv[n])
			t.row(fmt.Sprint(n), f0(f.rate()), f0(b.rate()), f0(r.rate()), ratio(b.rate(), f.rate()), ratio(b.rate(), r.rate()),
				f2(float64(b.attempts)/float64(max(b.items, 1))), fmt.Sprint(b.retries), ms(b.claims.pct(50)), ms(b.claims.pct(99)))
		}
		t.flush()
	}
	fmt.Printf("\n== worker.Loop, the default path: a handler per machine, N handlers, a commit callback per machine; "+
		"with CommitShared: one statement commits every machine of a batch (worker.Config.CommitShared); "+
		"2 processes: two Connections with N/2 handlers each; M=%d, median of %d rounds ==\n", cfg.machines, cfg.rounds)
	lt := newTable(os.Stdout, "N", "floor items/s", "loop items/s", "River jobs/s", "loop/River", "tx/item", "retries/item",
		"with CommitShared items/s", "with CommitShared/River", "2 procs items/s", "2 procs/River", "2 procs retries/item")
	for _, n := range cfg.workers {
		f, l, r, lg := median(floor[n]), median(loop[n]), median(rv[n]), median(loopGroup[n])
		two, twoRatio, twoRetries := "-", "-", "-"
		if len(loop2[n]) > 0 {
			l2 := median(loop2[n])
			two, twoRatio, twoRetries = f0(l2.rate()), ratio(l2.rate(), r.rate()), f2(float64(l2.retries)/float64(max(l2.items, 1)))
		}
		lt.row(fmt.Sprint(n), f0(f.rate()), f0(l.rate()), f0(r.rate()), ratio(l.rate(), r.rate()),
			f2(float64(l.attempts)/float64(max(l.items, 1))), f2(float64(l.retries)/float64(max(l.items, 1))),
			f0(lg.rate()), ratio(lg.rate(), r.rate()), two, twoRatio, twoRetries)
	}
	lt.flush()
	fmt.Println("exactly-once check (work_history, per bmdb run):")
	for _, c := range checks {
		fmt.Println("  " + c)
	}
	return nil
}

// bmdbOnce seeds m machines, processes them with n workers and checks that
// each was finished exactly once.
func bmdbOnce(ctx context.Context, conn *bmdb.Connection, m, n int, p pick, k, batch int) (result, check, error) {
	const process = "bench"
	if err := seed(ctx, conn.DB(), m); err != nil {
		return result{}, check{}, err
	}
	r, err := throughputCycle(conn, process, p, k, batch).run(ctx, n)
	if err != nil {
		return r, check{}, err
	}
	chk, err := verify(ctx, conn.DB(), process)
	if err == nil && (chk.none != 0 || chk.many != 0) {
		err = fmt.Errorf("exactly-once check failed: %s", chk)
	}
	return r, chk, err
}

// runPicks compares candidate choices at the largest worker count.
func runPicks(ctx context.Context, cfg config, conn *bmdb.Connection) error {
	n := slices.Max(cfg.workers)
	fmt.Printf("\n== Candidate choice: bmdb, N=%d, M=%d, %d candidates ==\n", n, cfg.machines, cfg.candidates)
	t := newTable(os.Stdout, "pick", "items/s", "tx/item", "retries", "conflicts", "claim p50", "claim p99", "exactly once")
	for _, p := range []pick{pickFirst, pickShuffle, pickOffset} {
		r, chk, err := bmdbOnce(ctx, conn, cfg.machines, n, p, cfg.candidates, 1)
		if err != nil {
			return fmt.Errorf("pick %s: %w", p, err)
		}
		t.row(string(p), f0(r.rate()), f2(float64(r.attempts)/float64(max(r.items, 1))), fmt.Sprint(r.retries),
			fmt.Sprint(r.conflicts), ms(r.claims.pct(50)), ms(r.claims.pct(99)), fmt.Sprint(chk.none == 0 && chk.many == 0))
	}
	t.flush()
	return nil
}
