package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/bmdb-dev/bmdb/bmdb"
)

// spreadSystems are the columns of the spread table, in run order: bmdb,
// River pgx with no-op jobs, River pgx with transactional jobs. River sql
// is left out to keep the section short (the procs section has it).
var spreadSystems = []string{sysBmdb, sysRiverPgx, sysRiverPgxTx}

// parseSpreadRows parses -spread: N/K pairs, e.g. "32/1,32/4", N workers
// in all over K processes. Each is returned as the procRow of its
// processes (N/K workers each); K must divide N.
func parseSpreadRows(s string) ([]procRow, error) {
	var rows []procRow
	for _, f := range strings.Split(s, ",") {
		var n, k int
		if _, err := fmt.Sscanf(strings.TrimSpace(f), "%d/%d", &n, &k); err != nil || n < 1 || k < 1 {
			return nil, fmt.Errorf("%q is not N/K (workers in all / processes)", f)
		}
		if n%k != 0 {
			return nil, fmt.Errorf("%q: K=%d does not divide N=%d (each process gets N/K workers)", f, k, n)
		}
		rows = append(rows, procRow{n: n / k, k: k})
	}
	return rows, nil
}

// spreadLabel names a spread row by its total: "N=32 K=4 (8 each)".
func spreadLabel(r procRow) string {
	return fmt.Sprintf("N=%d K=%d (%d each)", r.n*r.k, r.k, r.n)
}

// runSpread measures the same N workers spread over K OS processes (N/K
// each), bmdb (worker.Loop, one Connection per process) against River pgx
// (one client per process) with no-op and with transactional jobs, and
// prints the table and the diagnosis of the bmdb runs with K > 1.
func runSpread(ctx context.Context, cfg config, dsn string, conn *bmdb.Connection) error {
	pb, done, err := newProcsBench(ctx, cfg, dsn, conn, "spread", spreadSystems, cfg.spread, spreadLabel)
	if err != nil {
		return err
	}
	defer done()
	fmt.Printf("\n== Spread: N workers in all over K OS processes (N/K each), the same M=%d items, %d rounds ==\n", cfg.machines, cfg.rounds)
	if err := pb.measure(ctx); err != nil {
		return err
	}
	pb.printSpread(os.Stdout)
	return nil
}

// printSpread writes the spread table, the exactly-once checks and the
// diagnosis.
func (pb *procsBench) printSpread(out io.Writer) {
	t := newTable(out, "N", "K", "bmdb items/s", "River no-op/s", "River tx/s", "bmdb/River tx", "bmdb/River no-op",
		"bmdb K/K=1", "River tx K/K=1", "retries/item", "stale/item", "bmdb share", "River no-op share", "River tx share", "claim p99", "warnings")
	for _, row := range pb.rows {
		n := row.n * row.k
		b, _ := pb.medianRun(procKey{sysBmdb, row})
		rp, _ := pb.medianRun(procKey{sysRiverPgx, row})
		rt, _ := pb.medianRun(procKey{sysRiverPgxTx, row})
		// scale is the rate of sys over that of the K=1 row of the same N.
		scale := func(sys string, r procRun) string {
			if one, ok := pb.medianRun(procKey{sys, procRow{n, 1}}); ok {
				return ratio(r.rate(), one.rate())
			}
			return "-"
		}
		t.row(fmt.Sprint(n), fmt.Sprint(row.k), f0(b.rate()), f0(rp.rate()), f0(rt.rate()),
			ratio(b.rate(), rt.rate()), ratio(b.rate(), rp.rate()), scale(sysBmdb, b), scale(sysRiverPgxTx, rt),
			b.perItem(func(c childResult) int64 { return c.TxRetries }), b.perItem(func(c childResult) int64 { return c.ClaimsStale }),
			f2(b.share()), f2(rp.share()), f2(rt.share()), b.claimP99(), fmt.Sprint(b.warnings))
	}
	t.flush()
	pb.printChecksAndDiagnoses(out)
}
