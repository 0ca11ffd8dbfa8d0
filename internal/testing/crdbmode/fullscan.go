package crdbmode

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// A role's disallow_full_table_scans (Settings.DisallowFullTableScans).
// CockroachDB refuses, before running it, a statement whose plan scans a
// whole table or index (SQLSTATE P0003, "contains a full table/index scan
// which is explicitly disallowed"; from 23.1 only a scan of more rows than
// large_full_scan_rows, which the emulation takes to be every table). The
// emulation asks PostgreSQL's planner, with sequential scans priced out,
// for the plan of each of bmdb's statements (sqlc's "-- name: " comment)
// with its arguments, and refuses the statement as CockroachDB would if
// the plan still reads a table by a sequential scan or an index without a
// condition: no index can serve it. A transaction that ran
// SET LOCAL disallow_full_table_scans = off (bmdb's GC listing) is spared
// until it ends or restarts. PostgreSQL's planner is not CockroachDB's: the
// check finds statements that no index can serve, not every plan
// CockroachDB's optimizer might choose.

// codeTooManyRows is CockroachDB's code for a disallowed full scan.
const codeTooManyRows = "P0003"

// planNode is the part of EXPLAIN (FORMAT JSON)'s node that the check reads.
type planNode struct {
	NodeType  string     `json:"Node Type"`
	Relation  string     `json:"Relation Name"`
	Index     string     `json:"Index Name"`
	IndexCond string     `json:"Index Cond"`
	Plans     []planNode `json:"Plans"`
}

// fullScans returns the full scans in n's plan, as "table" or
// "table@index".
func (n planNode) fullScans() []string {
	var out []string
	switch n.NodeType {
	case "Seq Scan":
		out = append(out, n.Relation)
	case "Index Scan", "Index Only Scan", "Bitmap Index Scan":
		if n.IndexCond == "" {
			out = append(out, n.Relation+"@"+n.Index)
		}
	}
	for _, p := range n.Plans {
		out = append(out, p.fullScans()...)
	}
	return out
}

// checkFullScans refuses q, one of bmdb's statements about to run with
// args, if its plan needs a full scan (see above).
func (c *conn) checkFullScans(ctx context.Context, q string, args []driver.NamedValue) error {
	if c.tx != nil && c.tx.fullScansAllowed {
		return nil
	}
	if _, err := c.pq.ExecContext(ctx, "SET enable_seqscan = off", nil); err != nil {
		return err
	}
	plan, err := c.explain(ctx, q, args)
	if _, rerr := c.pq.ExecContext(ctx, "RESET enable_seqscan", nil); err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	var scans []string
	for _, p := range plan {
		scans = append(scans, p.Plan.fullScans()...)
	}
	if len(scans) > 0 {
		name, _, _ := strings.Cut(strings.TrimPrefix(q, "-- name: "), " ")
		return injected(codeTooManyRows, fmt.Sprintf("query %s contains a full table/index scan which is explicitly disallowed (%s; disallow_full_table_scans emulated)",
			name, strings.Join(scans, ", ")))
	}
	return nil
}

// explain returns the plan PostgreSQL would run q with.
func (c *conn) explain(ctx context.Context, q string, args []driver.NamedValue) ([]struct{ Plan planNode }, error) {
	rows, err := c.pq.QueryContext(ctx, "EXPLAIN (FORMAT JSON) "+q, args)
	if err != nil {
		return nil, fmt.Errorf("crdbmode: planning %.40q: %w", q, err)
	}
	defer rows.Close()
	dest := make([]driver.Value, 1)
	if err := rows.Next(dest); err != nil {
		if errors.Is(err, io.EOF) {
			err = errors.New("no plan")
		}
		return nil, fmt.Errorf("crdbmode: planning %.40q: %w", q, err)
	}
	var text []byte
	switch v := dest[0].(type) {
	case []byte:
		text = v
	case string:
		text = []byte(v)
	}
	var plan []struct{ Plan planNode }
	if err := json.Unmarshal(text, &plan); err != nil {
		return nil, fmt.Errorf("crdbmode: reading the plan of %.40q: %w", q, err)
	}
	return plan, nil
}
