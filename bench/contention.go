package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
)

// headSQL is the contention run's retrieval: only the oldest pending
// machine, claimed or not, so that every worker competes for it and only
// its Finish makes the next one claimable.
const headSQL = `SELECT machine_id FROM bench_pending ORDER BY seq LIMIT 1`

// contention is the outcome of runContention.
type contention struct {
	workers int
	res     result
	check   check
	// maxGap is the longest time without a claim; minPerSec the fewest
	// claims in any whole second of the run.
	maxGap    time.Duration
	minPerSec int
}

// runContention has n workers claim items machines, one claimable at a time.
func runContention(ctx context.Context, conn *bmdb.Connection, n, items int) (contention, error) {
	const process = "bench-contention"
	if err := seed(ctx, conn.DB(), items); err != nil {
		return contention{}, err
	}
	c := cycle{
		conn:    conn,
		process: process,
		retrieve: func(ctx context.Context) func(tx *bmdb.Tx) ([]uuid.UUID, error) {
			return func(tx *bmdb.Tx) ([]uuid.UUID, error) {
				var id uuid.UUID
				err := tx.DBTX().QueryRowContext(ctx, headSQL).Scan(&id)
				if errors.Is(err, sql.ErrNoRows) {
					return nil, nil // none left: ErrNothingToDo
				} else if err != nil {
					return nil, fmt.Errorf("retrieve head: %w", err)
				}
				return []uuid.UUID{id}, nil
			}
		},
		commit: finishCommit,
	}
	res, err := c.run(ctx, n)
	if err != nil {
		return contention{}, err
	}
	chk, err := verify(ctx, conn.DB(), process)
	out := contention{workers: n, res: res, check: chk}
	at := slices.Sorted(slices.Values(res.at))
	prev := time.Duration(0)
	perSec := map[int]int{}
	for _, t := range at {
		out.maxGap = max(out.maxGap, t-prev)
		prev = t
		perSec[int(t/time.Second)]++
	}
	out.minPerSec = -1
	for s := 0; s < int(res.elapsed/time.Second); s++ {
		if out.minPerSec < 0 || perSec[s] < out.minPerSec {
			out.minPerSec = perSec[s]
		}
	}
	return out, err
}

func printContention(out io.Writer, c contention) {
	r := c.res
	t := newTable(out, "workers", "claims", "claims/s", "tx attempts", "retries", "conflicts", "claim p50", "claim p99", "max gap", "min claims/s")
	minSec := "-"
	if c.minPerSec >= 0 {
		minSec = fmt.Sprint(c.minPerSec)
	}
	t.row(fmt.Sprint(c.workers), fmt.Sprint(r.items), f0(r.rate()), fmt.Sprint(r.attempts), fmt.Sprint(r.retries),
		fmt.Sprint(r.conflicts), ms(r.claims.pct(50)), ms(r.claims.pct(99)), ms(c.maxGap), minSec)
	t.flush()
	fmt.Fprintf(out, "no livelock: every machine claimed and finished (%s); longest time without a claim %s; every whole second had >= %s claims\n",
		c.check, ms(c.maxGap), minSec)
}
