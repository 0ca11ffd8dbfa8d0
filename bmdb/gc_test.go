package bmdb

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"

	"github.com/bmdb-dev/bmdb/internal/testing/crdbmode"
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

// GC's list reads sessions_deadline_idx over its window and nothing else:
// no scan of live sessions, nor of the entries below the window, which on
// CockroachDB hold the deleted entries of every heartbeat of the last
// gc.ttlseconds; and its lock reads only the listed rows, by primary key,
// the key a takeover's SKIP LOCKED reads. (Before, one statement read the
// index from its start and, on CockroachDB, locked only its keys there.)
func TestGCReadsOnlyExpiredSessions(t *testing.T) {
	e := newEnv(t)
	const live, expired, inWindow = 3000, 7, 3
	e.exec(`INSERT INTO sessions (component_name, runtime_info, interval_seconds, deadline)
		SELECT 'live', '', 10, now() + i * INTERVAL '1 second' FROM generate_series(1, $1::INT8) i`, live)
	e.exec(`INSERT INTO sessions (component_name, runtime_info, interval_seconds, deadline)
		SELECT 'dead', '', 10, now() - INTERVAL '1 hour' - i * INTERVAL '1 second' FROM generate_series(1, $1::INT8) i`, expired)
	e.exec("ANALYZE sessions")
	var bound, windowStart time.Time
	if err := e.db.QueryRow(`SELECT now() - INTERVAL '1 minute', now() - INTERVAL '1 hour' - $1 * INTERVAL '1 second' - INTERVAL '500 milliseconds'`,
		inWindow).Scan(&bound, &windowStart); err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	if err := e.db.QueryRow("SELECT array_agg(session_id) FROM sessions WHERE component_name = 'dead'").Scan(pq.Array(&ids)); err != nil {
		t.Fatal(err)
	}
	list, lock := queryOf(t, "sessions.sql", "SessionListExpired"), queryOf(t, "sessions.sql", "SessionLockExpired")
	if !strings.Contains(lock, "FOR UPDATE") || strings.Contains(list, "FOR UPDATE") {
		t.Fatalf("unexpected statements:\n%s\n%s", list, lock)
	}
	if testdb.Cockroach() {
		for name, plan := range map[string]string{
			"full list":   explain(t, e, list, time.Time{}, bound, gcBatch),
			"window list": explain(t, e, list, windowStart, bound, gcBatch),
			"lock":        explain(t, e, lock, pq.Array(ids)),
		} {
			t.Logf("%s plan:\n%s", name, plan)
			want := "sessions@sessions_deadline_idx"
			if name == "lock" {
				want = "sessions@sessions_pkey"
			}
			if !strings.Contains(plan, want) || strings.Contains(plan, "FULL SCAN") {
				t.Errorf("%s: the plan does not read %s only", name, want)
			}
		}
		return
	}
	for _, pass := range []struct {
		name  string
		after time.Time
		want  int
	}{{"full", time.Time{}, expired}, {"window", windowStart, inWindow}} {
		plan := explainAnalyze(t, e, list, pass.after, bound, gcBatch)
		t.Logf("%s plan:\n%s", pass.name, plan)
		scan := regexp.MustCompile(`Index (?:Only )?Scan using sessions_deadline_idx on sessions.*\(actual rows=(\d+) loops=1\)\n\s+Index Cond: \(\(deadline >= .*\) AND \(deadline < `).FindStringSubmatch(plan)
		if scan == nil || strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Filter") {
			t.Fatalf("%s: GC does not read sessions_deadline_idx over its window only:\n%s", pass.name, plan)
		}
		if scan[1] != strconv.Itoa(pass.want) {
			t.Errorf("%s: GC's scan read %s rows, want only the %d expired in it", pass.name, scan[1], pass.want)
		}
	}
	// EXPLAIN ANALYZE runs the statement (and takes its locks): inside a
	// transaction rolled back.
	plan := explainAnalyze(t, e, lock, pq.Array(ids))
	t.Logf("lock plan:\n%s", plan)
	if !regexp.MustCompile(`(?:Index Scan using sessions_pkey on sessions|Bitmap Index Scan on sessions_pkey) \(actual rows=`+strconv.Itoa(expired)+` `).MatchString(plan) || !strings.Contains(plan, "LockRows") {
		t.Errorf("GC does not lock the listed sessions by primary key:\n%s", plan)
	}
}

// explainAnalyze returns the plan of query run with args, in a transaction
// rolled back.
func explainAnalyze(t *testing.T, e *env, query string, args ...any) string {
	t.Helper()
	tx, err := e.db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	rows, err := tx.Query("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) "+query, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
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
	return b.String()
}

// sessionRow inserts a session row whose deadline is now() + offset on the
// database clock.
func (e *env) sessionRow(offset time.Duration) uuid.UUID {
	e.t.Helper()
	var id uuid.UUID
	err := e.db.QueryRow(`INSERT INTO sessions (component_name, runtime_info, interval_seconds, deadline)
		VALUES ('row', '', 1, now() + $1 * INTERVAL '1 second') RETURNING session_id`, offset.Seconds()).Scan(&id)
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

// A Connection's periodic GC reads only the window above its last
// complete pass: it collects a session that expires after that pass, and
// leaves one whose deadline was moved below it by hand to its next full
// pass (its first, then one every gcFullPassPeriod). CollectGarbage always
// reads everything (TestCollectGarbage).
func TestPeriodicGCReadsAWindow(t *testing.T) {
	e := newEnv(t)
	c := e.open(func(c *Config) { c.GCGracePeriod = time.Millisecond; c.GCPeriod = time.Hour })
	ctx := context.Background()
	gone := func(id uuid.UUID) bool {
		return e.count("SELECT count(*) FROM sessions WHERE session_id = $1", id) == 0
	}
	first := e.sessionRow(-time.Hour)
	if n, err := c.collectGarbage(ctx, false); err != nil || n != 1 || !gone(first) {
		t.Fatalf("first periodic pass (full) = %d, %v; want the session expired an hour ago deleted", n, err)
	}
	fresh, buried := e.sessionRow(0), e.sessionRow(-time.Hour)
	eventually(t, 5*time.Second, "a window pass to collect the session that expired after the last pass", func() bool {
		if _, err := c.collectGarbage(ctx, false); err != nil {
			t.Fatal(err)
		}
		return gone(fresh)
	})
	if gone(buried) {
		t.Fatal("a window pass collected a session whose deadline is below its window")
	}
	c.gc.mu.Lock()
	c.gc.lastFull = c.gc.lastFull.Add(-gcFullPassPeriod - time.Minute)
	c.gc.mu.Unlock()
	if n, err := c.collectGarbage(ctx, false); err != nil || n != 1 || !gone(buried) {
		t.Errorf("the periodic full pass = %d, %v; want the session below the window deleted", n, err)
	}
}

// A takeover and GC lock the same key of an expired session, its primary
// key (on CockroachDB a lock taken through sessions_deadline_idx would
// lock that index's key only): a takeover skips a session GC is
// deleting, at once, and looks again; GC waits for a takeover in progress
// and then finds the session gone. On a CockroachDB cluster the first
// half is not checked: there the claim's read of the holder's session row
// (WorkClaimStates), a plain read, waits for GC's exclusive lock before
// any SKIP LOCKED (docs/cockroachdb.md). (Before, on CockroachDB, GC
// locked the index keys only: a takeover did not skip it, and the two met
// at their deletes.)
func TestTakeoverAndGCLockTheSameKey(t *testing.T) {
	e := newEnv(t)
	c := e.open()
	ctx := context.Background()
	holder, taker := e.session(c), e.session(c)
	m := e.machine()
	if _, err := holder.Work(ctx, "install", retrieveAll(m)); err != nil {
		t.Fatal(err)
	}
	e.expireInDB(holder.ID(), time.Hour)
	if !testdb.Cockroach() {
		takeoverSkipsGC(t, e, holder, taker, m)
	}
	w, err := taker.Work(ctx, "install", retrieveAll(m))
	if err != nil {
		t.Fatalf("takeover once GC let go: %v", err)
	}

	// A takeover in progress: GC waits for it, then finds nothing.
	other := e.session(c)
	if _, err := other.Work(ctx, "provide", retrieveAll(m)); err != nil {
		t.Fatal(err)
	}
	e.expireInDB(other.ID(), time.Hour)
	// READ COMMITTED: PostgreSQL's SERIALIZABLE could abort this stand-in
	// at COMMIT for reading what GC reads, which a real takeover retries.
	takeover, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer takeover.Rollback()
	var locked uuid.UUID
	if err := takeover.QueryRow(queryOf(t, "sessions.sql", "SessionLockIfExpired"), other.ID()).Scan(&locked); err != nil {
		t.Fatalf("takeover's lock: %v", err)
	}
	collected := make(chan error, 1)
	var n int64
	go func() {
		var err error
		n, err = c.CollectGarbage(ctx)
		collected <- err
	}()
	select {
	case err := <-collected:
		t.Fatalf("GC did not wait for the takeover in progress: %d deleted, %v", n, err)
	case <-time.After(testInterval / 8):
	}
	if _, err := takeover.Exec("DELETE FROM sessions WHERE session_id = $1", other.ID()); err != nil {
		t.Fatal(err)
	}
	if err := takeover.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-collected; err != nil || n != 0 {
		t.Errorf("GC after the takeover = %d, %v; want nothing left to delete", n, err)
	}
	if err := w.Finish(ctx, noCommit); err != nil {
		t.Error(err)
	}
}

// takeoverSkipsGC holds a GC of holder's expired session after its lock
// statement, and checks that taker's takeover of m skips it at once.
func takeoverSkipsGC(t *testing.T, e *env, holder, taker *Session, m uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	gc, err := e.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Rollback()
	var locked uuid.UUID
	if err := gc.QueryRow(queryOf(t, "sessions.sql", "SessionLockExpired"), pq.Array([]uuid.UUID{holder.ID()})).Scan(&locked); err != nil || locked != holder.ID() {
		t.Fatalf("GC's lock = %v, %v", locked, err)
	}
	start := time.Now()
	_, err = taker.Work(ctx, "install", retrieveAll(m))
	took := time.Since(start)
	if !errors.Is(err, ErrWorkConflict) || took >= testInterval/4 {
		t.Fatalf("takeover of a session GC is deleting = %v after %v; want ErrWorkConflict at once (lock_timeout %v)", err, took, testInterval/4)
	}
}

// A GC attempt whose COMMIT fails, and whose retry finds the session
// already collected by another component, counts nothing: the count of an
// attempt that did not commit is not carried into the next one.
// (TestCollectGarbage met it by chance: six collectors counted 2 deletes.)
func TestCollectGarbageCountsOnlyWhatItCommitted(t *testing.T) {
	e := newEnv(t)
	slowGC := func(c *Config) { c.GCPeriod = time.Hour }
	// PostgreSQL's attempt, whose COMMIT the hook replaces, in either mode.
	c, other := e.open(withMode(crdbmode.Settings{}), slowGC), e.open(slowGC)
	old := e.session(other)
	e.expireInDB(old.ID(), time.Hour)

	var otherDeleted int64
	var otherErr error
	failed := false
	c.hooks.commit = func(tx *sql.Tx) error {
		if failed {
			return tx.Commit()
		}
		failed = true
		if err := tx.Rollback(); err != nil {
			return err
		}
		otherDeleted, otherErr = other.CollectGarbage(context.Background())
		return injected(codeSerializationFailure, "injected: could not serialize access")
	}
	n, err := c.CollectGarbage(context.Background())
	if err != nil || otherErr != nil {
		t.Fatalf("CollectGarbage: %v; the other collector's: %v", err, otherErr)
	}
	if !failed {
		t.Fatal("the commit hook never ran")
	}
	if n != 0 || otherDeleted != 1 {
		t.Errorf("the collector whose commit failed counted %d deletes, the one that committed %d; want 0 and 1", n, otherDeleted)
	}
	if got := e.count("SELECT count(*) FROM sessions WHERE session_id = $1", old.ID()); got != 0 {
		t.Errorf("expired session still there (%d rows)", got)
	}
}
