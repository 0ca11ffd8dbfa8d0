package crdbmode

import (
	"context"
	"database/sql/driver"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
)

// CockroachDB's locking differs from PostgreSQL's in two ways bmdb must
// not trip over, and the emulation reproduces both (verified by reading
// CockroachDB's source and issues, not on a cluster):
//
//   - Lock at fetch. Under SERIALIZABLE, with
//     optimizer_use_lock_op_for_serializable off (the default, and bmdb
//     pins it off), a locking read (FOR UPDATE, FOR NO KEY UPDATE, SKIP
//     LOCKED or not) locks every key its scan fetches, before the filters
//     the scan cannot apply and before LIMIT (cockroach#75457, #129145):
//     PostgreSQL locks only the rows that pass the filters, up to the
//     LIMIT. The scan's spans come from the predicates that constrain the
//     index it reads: for bmdb's statements, a column compared with a
//     parameter (col = $n, col = ANY ($n)). So before a statement with a
//     locking clause runs, the emulation locks, with the same strength and
//     SKIP LOCKED or NOWAIT, every row of the locked table that those
//     predicates select (lockModels). A locking read whose table no such
//     predicate constrains (a lookup join, say) is not modelled.
//   - Shared locks are plain reads. FOR SHARE and FOR KEY SHARE take no
//     lock under SERIALIZABLE while enable_shared_locking_for_serializable
//     is off (the default, and bmdb pins it off): a writer of the row does
//     not wait for them, and SERIALIZABLE orders the two. The emulation
//     removes the clause (sharedLocks), so PostgreSQL's SERIALIZABLE orders
//     them, as CockroachDB's does.
//
// And one way its clocks differ: every gateway node has its own clock,
// which may be off by up to the cluster's maximum offset, and now(),
// statement_timestamp() and clock_timestamp() read it. Settings.ClockOffset
// shifts an Emulator's clock (skewedClock), so that two Connections can
// stand for two gateways whose clocks disagree.

// sharedLockClause finds a FOR SHARE or FOR KEY SHARE clause, with its OF
// list and its SKIP LOCKED or NOWAIT.
var sharedLockClause = regexp.MustCompile(`(?i)\s+FOR\s+(?:KEY\s+)?SHARE\b(?:\s+OF\s+[A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*)?(?:\s+SKIP\s+LOCKED|\s+NOWAIT)?`)

// sharedLocks returns q without its shared locking clauses.
func sharedLocks(q string) string {
	if !strings.Contains(strings.ToUpper(q), "SHARE") {
		return q
	}
	return sharedLockClause.ReplaceAllString(q, "")
}

// clockCall finds a call of one of the clock functions a statement may
// read.
var clockCall = regexp.MustCompile(`(?i)\b(now|statement_timestamp|clock_timestamp|transaction_timestamp)\(\)`)

// skewedClock returns q with every read of the clock shifted by offset.
func skewedClock(q string, offset time.Duration) string {
	if offset == 0 {
		return q
	}
	shift := fmt.Sprintf(" + INTERVAL '%d microseconds')", offset.Microseconds())
	return clockCall.ReplaceAllStringFunc(q, func(call string) string { return "(" + call + shift })
}

// rewrite returns q as the emulation sends it to PostgreSQL: shared locks
// gone, its clock skewed, a transaction's own idle timeout a placeholder.
func (e *Emulator) rewrite(q string) string {
	return localIdleTimeout(skewedClock(sharedLocks(q), e.s.ClockOffset))
}

// A lockModel is what one locking read of a statement locks on
// CockroachDB: a query that locks the same rows in PostgreSQL, and which
// of the statement's arguments it takes, in order.
type lockModel struct {
	query string
	args  []int // indexes into the statement's arguments
}

// lockModelCache holds the models of each statement text.
var lockModelCache sync.Map // string -> []lockModel

// lockingClause finds an exclusive locking clause, with its OF list and
// its wait policy.
var exclusiveLockClause = regexp.MustCompile(`(?i)\bFOR\s+(UPDATE|NO\s+KEY\s+UPDATE)\b((?:\s+OF\s+[A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*)?)((?:\s+SKIP\s+LOCKED|\s+NOWAIT)?)`)

// lockModels returns the models of q's locking reads (see above).
func lockModels(q string) []lockModel {
	if m, ok := lockModelCache.Load(q); ok {
		return m.([]lockModel)
	}
	var models []lockModel
	for _, loc := range exclusiveLockClause.FindAllStringSubmatchIndex(q, -1) {
		if m, ok := modelOf(q, loc); ok {
			models = append(models, m)
		}
	}
	lockModelCache.Store(q, models)
	return models
}

// modelOf builds the model of the locking clause at loc (a submatch index
// of exclusiveLockClause) in q.
func modelOf(q string, loc []int) (lockModel, bool) {
	strength := strings.ToUpper(strings.Join(strings.Fields(q[loc[2]:loc[3]]), " "))
	var of []string
	if loc[4] < loc[5] {
		for _, a := range strings.Split(strings.TrimSpace(q[loc[4]:loc[5]])[2:], ",") {
			of = append(of, strings.TrimSpace(a))
		}
	}
	policy := strings.ToUpper(strings.Join(strings.Fields(q[loc[6]:loc[7]]), " "))
	// The SELECT the clause ends: the text from the innermost parenthesis
	// open at the clause (or the start) to the clause.
	start := enclosingOpen(q, loc[0])
	sel := q[start:loc[0]]
	from, where := clauses(sel)
	if from == "" {
		return lockModel{}, false
	}
	table, alias, ok := lockedTable(from, of)
	if !ok {
		return lockModel{}, false
	}
	var conds []string
	var args []int
	for _, c := range splitTopLevel(where, "AND") {
		col, n, many, ok := paramPredicate(c, alias)
		if !ok {
			continue
		}
		args = append(args, n-1)
		if many {
			conds = append(conds, fmt.Sprintf("%s = ANY ($%d)", col, len(args)))
		} else {
			conds = append(conds, fmt.Sprintf("%s = $%d", col, len(args)))
		}
	}
	if len(conds) == 0 {
		return lockModel{}, false
	}
	query := "SELECT 1 FROM " + table + " WHERE " + strings.Join(conds, " AND ") + " FOR " + strength
	if policy != "" {
		query += " " + policy
	}
	return lockModel{query: query, args: args}, true
}

// enclosingOpen returns the index right after the innermost '(' open at
// position at in q, or the start of q's first statement line after its
// sqlc name comment.
func enclosingOpen(q string, at int) int {
	depth := 0
	for i := at - 1; i >= 0; i-- {
		switch q[i] {
		case ')':
			depth++
		case '(':
			if depth == 0 {
				return i + 1
			}
			depth--
		}
	}
	return 0
}

// clauses returns the FROM and WHERE clauses of sel, a SELECT, at its top
// level.
func clauses(sel string) (from, where string) {
	fromAt := topLevelKeyword(sel, "FROM", 0)
	if fromAt < 0 {
		return "", ""
	}
	whereAt := topLevelKeyword(sel, "WHERE", fromAt)
	end := len(sel)
	for _, kw := range []string{"GROUP", "ORDER", "LIMIT", "HAVING", "WINDOW"} {
		if i := topLevelKeyword(sel, kw, fromAt); i >= 0 && i < end {
			end = i
		}
	}
	if whereAt < 0 || whereAt > end {
		return sel[fromAt+4 : end], ""
	}
	return sel[fromAt+4 : whereAt], sel[whereAt+5 : end]
}

// topLevelKeyword returns the index of keyword kw in s at parenthesis
// depth 0, from index from on, or -1.
func topLevelKeyword(s, kw string, from int) int {
	depth := 0
	for i := from; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
		case '\'':
			if j := strings.IndexByte(s[i+1:], '\''); j >= 0 {
				i += j + 1
			}
		default:
			if depth == 0 && wordAt(s, i, kw) {
				return i
			}
		}
	}
	return -1
}

// wordAt reports whether s has the word w (case-insensitively) at i.
func wordAt(s string, i int, w string) bool {
	if i+len(w) > len(s) || !strings.EqualFold(s[i:i+len(w)], w) {
		return false
	}
	isWord := func(b byte) bool { return b == '_' || unicode.IsLetter(rune(b)) || unicode.IsDigit(rune(b)) }
	return (i == 0 || !isWord(s[i-1])) && (i+len(w) == len(s) || !isWord(s[i+len(w)]))
}

// splitTopLevel splits s at the word sep at parenthesis depth 0.
func splitTopLevel(s, sep string) []string {
	var parts []string
	for {
		i := topLevelKeyword(s, sep, 0)
		if i < 0 {
			return append(parts, strings.TrimSpace(s))
		}
		parts = append(parts, strings.TrimSpace(s[:i]))
		s = s[i+len(sep):]
	}
}

// lockedTable returns the table a locking clause locks (the one its OF
// names, or the only table of from) and its alias.
func lockedTable(from string, of []string) (table, alias string, ok bool) {
	for _, item := range strings.Split(from, ",") {
		f := strings.Fields(item)
		if len(f) == 0 || strings.HasPrefix(f[0], "(") {
			continue
		}
		name, as := f[0], f[0]
		switch {
		case len(f) >= 3 && strings.EqualFold(f[1], "AS"):
			as = f[2]
		case len(f) >= 2:
			as = f[1]
		}
		if len(of) == 0 {
			if strings.Contains(from, ",") || len(f) > 3 || len(f) == 3 && !strings.EqualFold(f[1], "AS") {
				return "", "", false // several tables, or a join: not modelled
			}
			return name + " " + as, as, true
		}
		for _, o := range of {
			if strings.EqualFold(o, as) {
				return name + " " + as, as, true
			}
		}
	}
	return "", "", false
}

// paramPredicate matches a conjunct that constrains a scan: a column of
// alias compared with a parameter, col = $n or col = ANY ($n), with casts.
var paramPredicateRE = regexp.MustCompile(`(?is)^(?:([A-Za-z_][A-Za-z0-9_]*)\.)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(ANY\s*\(\s*)?\$(\d+)(?:::[A-Za-z0-9_\[\]]+)?\s*(\))?$`)

func paramPredicate(c, alias string) (col string, n int, many bool, ok bool) {
	m := paramPredicateRE.FindStringSubmatch(strings.TrimSpace(c))
	if m == nil || (m[1] != "" && !strings.EqualFold(m[1], alias)) || (m[3] != "") != (m[5] != "") {
		return "", 0, false, false
	}
	n, err := strconv.Atoi(m[4])
	if err != nil || n < 1 {
		return "", 0, false, false
	}
	if m[1] != "" {
		col = m[1] + "." + m[2]
	} else {
		col = m[2]
	}
	return col, n, m[3] != "", true
}

// lockAtFetch takes, in c's transaction, the locks CockroachDB's scans
// would take for the locking reads of q (the text as sent) with args.
func (c *conn) lockAtFetch(ctx context.Context, q string, args []driver.NamedValue) error {
	for _, m := range lockModels(q) {
		margs := make([]driver.NamedValue, len(m.args))
		for i, a := range m.args {
			if a >= len(args) {
				return fmt.Errorf("crdbmode: the lock model %q takes argument %d of %d", m.query, a+1, len(args))
			}
			margs[i] = driver.NamedValue{Ordinal: i + 1, Value: args[a].Value}
		}
		rows, err := c.pq.QueryContext(ctx, m.query, margs)
		if err != nil {
			return err
		}
		if err := drain(rows); err != nil {
			return err
		}
		c.e.count(LocksAtFetch)
	}
	return nil
}
