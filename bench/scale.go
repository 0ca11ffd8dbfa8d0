package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/google/uuid"
	"github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/bmdb"
)

// Scale setup: of the pending machines, every 10th (seq % 10 = 3) is in
// backoff for the process for an hour, and every 100th (seq % 100 = 7) is
// claimed by a live session, spread evenly over the retrieval order.
const (
	scaleBackoffSQL = `
INSERT INTO work_backoff (machine_id, process, until, cause, interval_seconds)
SELECT machine_id, $1, now() + INTERVAL '1 hour', 'bench', 3600 FROM bench_pending WHERE seq % 10 = 3`
	scaleLiveWorkSQL = `
INSERT INTO work (machine_id, process, session_id)
SELECT machine_id, $1, $2 FROM bench_pending WHERE seq % 100 = 7`
)

// The statements of a claim, for EXPLAIN: bmdb's SessionCheck and
// WorkClaimMany (the claim; WorkClaimStates runs only when it claims
// nothing) and Finish's WorkFinishMany, simplified copies (no fencing
// token, no component) of queries/internal/sessions.sql and work.sql (keep
// in sync), and the bench's retrieveSQL.
const (
	sessionCheckSQL = `SELECT session_id FROM sessions WHERE session_id = $1 AND deadline > now()`
	workClaimSQL    = `
WITH locked AS (
    SELECT m.machine_id FROM machines m
    WHERE m.machine_id = ANY ($1::UUID[])
    ORDER BY m.machine_id
    FOR NO KEY UPDATE SKIP LOCKED
), claim AS (
    INSERT INTO work (machine_id, process, session_id)
    SELECT locked.machine_id, $2::TEXT, $3::UUID
    FROM locked
    WHERE NOT EXISTS (
        SELECT 1 FROM work_backoff b
        WHERE b.machine_id = locked.machine_id AND b.process = $2::TEXT AND b.until > now()
    )
    ON CONFLICT (machine_id, process) DO NOTHING
    RETURNING machine_id, process, session_id, started_at, claim_id
)
INSERT INTO work_history (machine_id, process, session_id, event, at, component_name, claim_id)
SELECT claim.machine_id, claim.process, claim.session_id, 'Started', claim.started_at, 'bench', claim.claim_id
FROM claim
RETURNING work_history.machine_id, work_history.claim_id`
	workFinishSQL = `
WITH ended AS (
    DELETE FROM work
    WHERE work.process = $2::TEXT AND work.session_id = $3::UUID
      AND work.machine_id = ANY ($1::UUID[]) AND work.claim_id = ANY ($4::UUID[])
    RETURNING work.machine_id, work.process, work.session_id, work.claim_id
), cleared AS (
    DELETE FROM work_backoff
    WHERE work_backoff.machine_id IN (SELECT ended.machine_id FROM ended) AND work_backoff.process = $2::TEXT
    RETURNING work_backoff.machine_id
)
INSERT INTO work_history (machine_id, process, session_id, event, component_name, claim_id)
SELECT ended.machine_id, ended.process, ended.session_id, 'Finished', 'bench', ended.claim_id
FROM ended`
)

// scaleResult is the claim latency and plans at one table size.
type scaleResult struct {
	machines int
	res      result
	plans    []plan
}

// plan is one EXPLAIN (ANALYZE, BUFFERS) output.
type plan struct {
	name  string
	lines []string
}

var seqScan = regexp.MustCompile(`Seq Scan on (\w+)`)

// summary is a one-line digest of p: execution time, buffers, seq scans.
func (p plan) summary() string {
	var exec, buffers string
	var scans []string
	for i, l := range p.lines {
		t := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(t, "Execution Time:"):
			exec = strings.TrimPrefix(t, "Execution Time: ")
		case i == 1 && strings.HasPrefix(t, "Buffers:"):
			buffers = strings.TrimPrefix(t, "Buffers: ")
		}
		if m := seqScan.FindStringSubmatch(l); m != nil {
			scans = append(scans, m[1])
		}
	}
	seq := "none"
	if len(scans) > 0 {
		seq = strings.Join(scans, ",")
	}
	return fmt.Sprintf("%-14s exec %-9s buffers %-22s seq scans: %s", p.name, exec, buffers, seq)
}

// runScale seeds size machines with backoff and live work, measures claims
// cycles of one worker, and explains the claim's statements.
func runScale(ctx context.Context, conn *bmdb.Connection, size, claims int) (scaleResult, error) {
	db := conn.DB()
	const process = "bench-scale"
	if err := seed(ctx, db, size); err != nil {
		return scaleResult{}, err
	}
	holder, err := conn.StartSession(ctx)
	if err != nil {
		return scaleResult{}, err
	}
	defer holder.Close(context.Background())
	if _, err := db.ExecContext(ctx, scaleBackoffSQL, process); err != nil {
		return scaleResult{}, fmt.Errorf("backoff setup: %w", err)
	}
	if _, err := db.ExecContext(ctx, scaleLiveWorkSQL, process, holder.ID()); err != nil {
		return scaleResult{}, fmt.Errorf("live work setup: %w", err)
	}
	if _, err := db.ExecContext(ctx, "VACUUM ANALYZE"); err != nil {
		return scaleResult{}, err
	}
	c := throughputCycle(conn, process, pickShuffle, 16, 1)
	c.limit = int64(claims)
	res, err := c.run(ctx, 1)
	if err != nil {
		return scaleResult{}, err
	}
	plans, err := explainClaim(ctx, db, process, holder.ID().String())
	return scaleResult{machines: size, res: res, plans: plans}, err
}

// explainClaim explains the statements of one claim inside a SERIALIZABLE
// transaction that it rolls back.
func explainClaim(ctx context.Context, db *sql.DB, process, session string) ([]plan, error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	var machine string
	if err := tx.QueryRowContext(ctx, retrieveSQL, process, 1, 0).Scan(&machine); err != nil {
		return nil, fmt.Errorf("explain: no candidate: %w", err)
	}
	stmts := []struct {
		name string
		rows func() (*sql.Rows, error)
	}{
		{"SessionCheck", func() (*sql.Rows, error) { return tx.QueryContext(ctx, explainPrefix+sessionCheckSQL, session) }},
		{"retrieve", func() (*sql.Rows, error) { return tx.QueryContext(ctx, explainPrefix+retrieveSQL, process, 16, 0) }},
		{"WorkClaimMany", func() (*sql.Rows, error) {
			return tx.QueryContext(ctx, explainPrefix+workClaimSQL, pq.Array([]string{machine}), process, session)
		}},
		{"WorkFinishMany", func() (*sql.Rows, error) {
			return tx.QueryContext(ctx, explainPrefix+workFinishSQL, pq.Array([]string{machine}), process, session, pq.Array([]string{uuid.NewString()}))
		}},
	}
	var plans []plan
	for _, s := range stmts {
		p, err := planLines(s.rows())
		if err != nil {
			return nil, fmt.Errorf("explain %s: %w", s.name, err)
		}
		plans = append(plans, plan{name: s.name, lines: p})
	}
	return plans, nil
}

const explainPrefix = "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "

// planLines reads the lines of an EXPLAIN.
func planLines(rows *sql.Rows, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			return nil, err
		}
		lines = append(lines, l)
	}
	return lines, rows.Err()
}

// printScale prints latency per size, plan digests per size, and the full
// plans of the largest size.
func printScale(out io.Writer, rs []scaleResult) {
	t := newTable(out, "machines", "claims", "claim p50", "claim p99", "retries", "items/s")
	for _, r := range rs {
		t.row(fmt.Sprint(r.machines), fmt.Sprint(r.res.items), ms(r.res.claims.pct(50)), ms(r.res.claims.pct(99)),
			fmt.Sprint(r.res.retries), f0(r.res.rate()))
	}
	t.flush()
	for _, r := range rs {
		fmt.Fprintf(out, "\nEXPLAIN digest at %d machines (10%% in backoff, 1%% with live work):\n", r.machines)
		for _, p := range r.plans {
			fmt.Fprintln(out, "  "+p.summary())
		}
	}
	if len(rs) == 0 {
		return
	}
	last := rs[len(rs)-1]
	for _, p := range last.plans {
		if p.name == "SessionCheck" {
			continue
		}
		fmt.Fprintf(out, "\nEXPLAIN (ANALYZE, BUFFERS) %s at %d machines:\n", p.name, last.machines)
		for _, l := range p.lines {
			fmt.Fprintln(out, "  "+l)
		}
	}
}
