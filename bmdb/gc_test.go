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

	"github.com/bmdb-dev/bmdb/internal/lease"
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

// GC lists expired sessions from the primary index, the table's only
// one (an index on deadline would gain a deleted entry per heartbeat on
// CockroachDB), without locking them, and locks them by primary key, SKIP
// LOCKED, the key a takeover's SKIP LOCKED reads; the lock reads only the
// listed rows.
func TestGCListsAndLocksByPrimaryKey(t *testing.T) {
	e := newEnv(t)
	const live, expired = 3000, 7
	e.exec(`INSERT INTO sessions (component_name, runtime_info, interval_seconds, deadline)
		SELECT 'live', '', 10, now() + i * INTERVAL '1 second' FROM generate_series(1, $1::INT8) i`, live)
	e.exec(`INSERT INTO sessions (component_name, runtime_info, interval_seconds, deadline)
		SELECT 'dead', '', 10, now() - INTERVAL '1 hour' - i * INTERVAL '1 second' FROM generate_series(1, $1::INT8) i`, expired)
	e.exec("ANALYZE sessions")
	if !testdb.Cockroach() {
		if n := e.count("SELECT count(*) FROM pg_indexes WHERE tablename = 'sessions' AND indexname <> 'sessions_pkey'"); n != 0 {
			t.Errorf("sessions has %d indexes besides its primary key; heartbeats would move their entries", n)
		}
	}
	var bound time.Time
	if err := e.db.QueryRow(`SELECT now() - INTERVAL '1 minute'`).Scan(&bound); err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	if err := e.db.QueryRow("SELECT array_agg(session_id) FROM sessions WHERE component_name = 'dead'").Scan(pq.Array(&ids)); err != nil {
		t.Fatal(err)
	}
	list, lock := queryOf(t, "sessions.sql", "SessionListExpired"), queryOf(t, "sessions.sql", "SessionLockExpired")
	if !strings.Contains(lock, "FOR UPDATE SKIP LOCKED") || strings.Contains(list, "FOR ") {
		t.Fatalf("unexpected statements:\n%s\n%s", list, lock)
	}
	if testdb.Cockroach() {
		plan := explain(t, e, lock, pq.Array(ids), bound)
		t.Logf("lock plan:\n%s", plan)
		if !strings.Contains(plan, "sessions@sessions_pkey") || strings.Contains(plan, "FULL SCAN") {
			t.Errorf("the lock does not read the listed keys of sessions_pkey only")
		}
		return
	}
	rows, err := e.db.Query(list, bound, lease.GCListLimit)
	if err != nil {
		t.Fatal(err)
	}
	listed := 0
	for rows.Next() {
		listed++
	}
	if err := rows.Err(); err != nil || listed != expired {
		t.Errorf("the list returned %d sessions (%v), want the %d expired", listed, err, expired)
	}
	// EXPLAIN ANALYZE runs the statement (and takes its locks): inside a
	// transaction rolled back.
	plan := explainAnalyze(t, e, lock, pq.Array(ids), bound)
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

// A periodic GC pass has a budget (the time to the next heartbeat, at
// most interval/4), and on a slow server it may not list and delete every
// expired session within it: each batch it deletes commits on its own, so
// every pass makes progress and the next one lists what is left. The
// emulated server spends perSession per session a statement abandons:
// before, one transaction abandoned up to the 1,000 sessions a pass
// lists, never finished within the budget, and a pass deleted nothing,
// forever. The budget is nine tenths of what that one transaction sleeps
// alone, so it still cannot fit however fast or slow the machine (load
// only makes it slower); a batch of 100 sleeps a tenth of that, and the
// other eight tenths are the margin for a loaded machine's real work
// (with 1 ms per session, a second, it once fell short under -race and
// a load average of 10).
func TestGCProgressesWithinItsBudget(t *testing.T) {
	e := newEnv(t)
	em := crdbmode.New(crdbmode.Settings{Enabled: true}, nil)
	em.Off()
	const perSession = 4 * time.Millisecond
	em.Slow("WorkAbandonOfSessions", perSession)
	c := e.open(func(c *Config) {
		c.WrapConnector, c.GCGracePeriod, c.GCPeriod = em.Wrap, time.Millisecond, time.Hour
	})
	const dead = 1500
	e.exec(`INSERT INTO sessions (component_name, runtime_info, interval_seconds, deadline)
		SELECT 'dead', '', 1, now() - INTERVAL '1 hour' FROM generate_series(1, $1::INT8)`, dead)
	e.exec(`INSERT INTO machines (machine_id) SELECT gen_random_uuid() FROM generate_series(1, $1::INT8)`, dead)
	e.exec(`INSERT INTO work (machine_id, process, session_id)
		SELECT m.machine_id, 'install', s.session_id
		FROM (SELECT machine_id, row_number() OVER () AS n FROM machines) m
		JOIN (SELECT session_id, row_number() OVER () AS n FROM sessions) s ON s.n = m.n`)
	left := func() int { return e.count("SELECT count(*) FROM sessions") }
	const budget = lease.GCListLimit * perSession * 9 / 10
	// A batch that a pass's budget cut in the middle of a statement holds
	// its sessions on the server until that statement ends and the server
	// finds the connection gone, and the next pass, here at once, skips
	// them (SKIP LOCKED, as it skips a takeover's): on a loaded machine
	// that can be every session left. The next pass waits for no other
	// transaction of the database to hold the sessions table: what it
	// must then delete is what it alone can lock.
	held := func() bool {
		return e.count(`SELECT count(*) FROM pg_locks
			WHERE database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND relation = 'sessions'::regclass AND pid <> pg_backend_pid()`) > 0
	}
	for pass := 1; left() > 0; pass++ {
		eventually(t, 30*time.Second, "the server to end the transactions the last pass's budget cut", func() bool { return !held() })
		before := left()
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		n, _, err := c.collector.Pass(ctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		// A batch whose COMMIT the budget cut may have committed all the
		// same (it is not counted, and shows in the next pass's figures).
		if after := left(); after >= before || n > int64(before-after) || n == 0 {
			t.Fatalf("pass %d of %v deleted %d (counted %d) of %d expired sessions: no progress (%v)", pass, budget, before-after, n, before, err)
		}
		if pass > 2*dead/100 {
			t.Fatalf("%d sessions left after %d passes", left(), pass)
		}
	}
	if got := e.count("SELECT count(*) FROM work_history WHERE event = 'Abandoned'"); got != dead {
		t.Errorf("%d Abandoned rows, want %d", got, dead)
	}
}

// A takeover and GC lock the same key of an expired session, its primary
// key, and skip each other: a takeover skips a session GC is deleting, at
// once, and looks again; GC skips a session a takeover is superseding, at
// once, and leaves it to the takeover. On a CockroachDB cluster the first
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
		takeoverSkipsGC(t, e, c, holder, taker, m)
	}
	w, err := taker.Work(ctx, "install", retrieveAll(m))
	if err != nil {
		t.Fatalf("takeover once GC let go: %v", err)
	}

	// A takeover in progress: GC skips it, at once, and then finds nothing.
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
	// As above, "at once" is no lock wait (no lock_timeout counted); the
	// time bound only catches a GC that waits until the takeover ends.
	waits := c.Stats().TxLockTimeouts
	collected := make(chan error, 1)
	var n int64
	go func() {
		var err error
		n, err = c.CollectGarbage(ctx)
		collected <- err
	}()
	select {
	case err := <-collected:
		if err != nil || n != 0 {
			t.Fatalf("GC beside a takeover in progress = %d, %v; want it skipped", n, err)
		}
		if n := c.Stats().TxLockTimeouts - waits; n != 0 {
			t.Fatalf("GC beside a takeover in progress waited out lock_timeout %d times; want no wait", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("GC waited for the takeover in progress")
	}
	if _, err := takeover.Exec("DELETE FROM sessions WHERE session_id = $1", other.ID()); err != nil {
		t.Fatal(err)
	}
	if err := takeover.Commit(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.CollectGarbage(ctx); err != nil || n != 0 {
		t.Errorf("GC after the takeover = %d, %v; want nothing left to delete", n, err)
	}
	if err := w.Finish(ctx, noCommit); err != nil {
		t.Error(err)
	}
}

// takeoverSkipsGC holds a GC of holder's expired session after its lock
// statement, and checks that taker's takeover of m skips it at once.
func takeoverSkipsGC(t *testing.T, e *env, c *Connection, holder, taker *Session, m uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	gc, err := e.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Rollback()
	var locked uuid.UUID
	if err := gc.QueryRow(queryOf(t, "sessions.sql", "SessionLockExpired"), pq.Array([]uuid.UUID{holder.ID()}), time.Now().Add(time.Hour)).Scan(&locked); err != nil || locked != holder.ID() {
		t.Fatalf("GC's lock = %v, %v", locked, err)
	}
	// "At once" is that the takeover waited for no lock: a wait would
	// end in lock_timeout (interval/4) and be retried, which the
	// Connection's stats count; the time taken only catches a hang, since
	// on a loaded machine a Work alone can take longer than lock_timeout.
	waits := c.Stats().TxLockTimeouts
	start := time.Now()
	_, err = taker.Work(ctx, "install", retrieveAll(m))
	took := time.Since(start)
	if !errors.Is(err, ErrWorkConflict) || took > 10*time.Second {
		t.Fatalf("takeover of a session GC is deleting = %v after %v; want ErrWorkConflict at once", err, took)
	}
	if n := c.Stats().TxLockTimeouts - waits; n != 0 {
		t.Fatalf("takeover of a session GC is deleting waited out lock_timeout %d times (in %v); want no wait", n, took)
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
	c.runner.Hooks.Commit = func(tx *sql.Tx) error {
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
