package bmdb

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
)

// queryOf returns the statement of the named query in one of bmdb's query
// files, with sqlc.arg(...) numbered as sqlc numbers them.
func queryOf(t *testing.T, file, name string) string {
	t.Helper()
	src, err := os.ReadFile("../queries/internal/" + file)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(src), "-- name: "+name+" ")
	if !ok {
		t.Fatalf("no query %s in %s", name, file)
	}
	var lines []string
	for _, line := range strings.Split(rest, "\n")[1:] {
		if strings.HasPrefix(line, "--") {
			continue
		}
		lines = append(lines, line)
		if strings.HasSuffix(line, ";") {
			break
		}
	}
	query := strings.TrimSuffix(strings.Join(lines, "\n"), ";")
	args := map[string]string{}
	return regexp.MustCompile(`sqlc\.arg\((\w+)\)`).ReplaceAllStringFunc(query, func(m string) string {
		if _, ok := args[m]; !ok {
			args[m] = "$" + string(rune('0'+len(args)+1))
		}
		return args[m]
	})
}

// GC's statement reads sessions_deadline_idx up to the expiry bound and
// nothing else: no scan of live sessions, which CockroachDB would lock
// (FOR UPDATE locks every row its scan reads there, unless
// optimizer_use_lock_op_for_serializable is on). (Before, it was ordered
// by session_id, which CockroachDB serves from the primary index.)
func TestGCReadsOnlyExpiredSessions(t *testing.T) {
	e := newEnv(t)
	const live, expired = 3000, 7
	e.exec(`INSERT INTO sessions (component_name, runtime_info, interval_seconds, deadline)
		SELECT 'live', '', 10, now() + i * INTERVAL '1 second' FROM generate_series(1, $1::INT8) i`, live)
	e.exec(`INSERT INTO sessions (component_name, runtime_info, interval_seconds, deadline)
		SELECT 'dead', '', 10, now() - INTERVAL '1 hour' - i * INTERVAL '1 second' FROM generate_series(1, $1::INT8) i`, expired)
	e.exec("ANALYZE sessions")
	query := queryOf(t, "sessions.sql", "SessionLockExpired")
	if !strings.Contains(query, "FOR UPDATE") {
		t.Fatalf("unexpected statement:\n%s", query)
	}
	args := []any{60.0, gcBatch}
	if testdb.Cockroach() {
		plan := explain(t, e, query, args...)
		if !strings.Contains(plan, "sessions@sessions_deadline_idx") || strings.Contains(plan, "FULL SCAN") {
			t.Errorf("GC does not read only sessions_deadline_idx:\n%s", plan)
		}
		t.Logf("plan:\n%s", plan)
		return
	}
	// EXPLAIN ANALYZE runs the statement (and takes its locks): inside a
	// transaction rolled back.
	tx, err := e.db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	rows, err := tx.Query("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) "+query, args...)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		b.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	plan := b.String()
	t.Logf("plan:\n%s", plan)
	scan := regexp.MustCompile(`Index Scan using sessions_deadline_idx on sessions.*\(actual rows=(\d+) loops=1\)\n\s+Index Cond: \(deadline < `).FindStringSubmatch(plan)
	if scan == nil || strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Filter") {
		t.Fatalf("GC does not scan sessions_deadline_idx up to the expiry bound:\n%s", plan)
	}
	if scan[1] != strconv.Itoa(expired) {
		t.Errorf("GC's scan read %s rows, want only the %d expired", scan[1], expired)
	}
}
