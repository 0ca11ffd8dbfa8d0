package bmdb

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/testing/testdb"

	"github.com/bmdb-dev/bmdb/model"
)

// ClearBackoff lets a machine be claimed at once, restarts its backoff
// growth, and is recorded in history under the operator's session.
func TestClearBackoff(t *testing.T) {
	e := newWorkEnv(t)
	s := e.session(e.open())
	op := e.session(e.open(func(c *Config) { c.ComponentName = "bmdbctl" }))
	m := e.machine()
	ctx := context.Background()
	w, _ := s.Work(ctx, "install", retrieveAll(m))
	if err := w.Fail(ctx, &Backoff{Initial: time.Hour, Maximum: time.Hour, Exponent: 2}, "disk"); err != nil {
		t.Fatal(err)
	}
	if err := op.ClearBackoff(ctx, m, "install", "disk replaced"); err != nil {
		t.Fatalf("ClearBackoff: %v", err)
	}
	if err := op.ClearBackoff(ctx, m, "install", "again"); !errors.Is(err, ErrNoBackoff) {
		t.Errorf("second ClearBackoff = %v, want ErrNoBackoff", err)
	}
	if _, err := s.Work(ctx, "install", retrieveAll(m)); err != nil {
		t.Fatalf("Work after ClearBackoff: %v", err)
	}
	rows, err := e.q.ReadableHistoryForMachine(ctx, model.ReadableHistoryForMachineParams{MachineID: m, RowLimit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := len(rows) - 1; i >= 0; i-- {
		got = append(got, rows[i].Event+"/"+rows[i].ComponentName+"/"+rows[i].Cause)
	}
	if !slicesEqual(got, "Started/test/", "Failed/test/disk", "BackoffCleared/bmdbctl/disk replaced", "Started/test/") {
		t.Errorf("readable history = %v", got)
	}
}

// PruneHistory deletes only rows older than the period, in batches.
func TestPruneHistory(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open()
	m := e.machine()
	e.exec(`INSERT INTO work_history (machine_id, process, session_id, event, at)
		SELECT $1, 'install', gen_random_uuid(), 'Started', now() - (i * INTERVAL '1 hour')
		FROM generate_series(1, 250) AS i`, m)
	n, err := c.PruneHistory(context.Background(), 100*time.Hour+time.Minute, 40)
	if err != nil || n != 150 {
		t.Fatalf("PruneHistory = %d, %v; want 150", n, err)
	}
	if left := e.count("SELECT count(*) FROM work_history"); left != 100 {
		t.Errorf("%d rows left, want 100", left)
	}
	if n := e.count("SELECT count(*) FROM work_history WHERE at < now() - INTERVAL '100 hours 1 minute'"); n != 0 {
		t.Errorf("%d old rows left", n)
	}
	for _, bad := range []struct {
		older time.Duration
		batch int
	}{{0, 10}, {-time.Hour, 10}, {time.Hour, -1}} {
		if _, err := c.PruneHistory(context.Background(), bad.older, bad.batch); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("PruneHistory(%v, %d) = %v", bad.older, bad.batch, err)
		}
	}
}

// The views answer the operator's questions, and the history lookups stay
// index scans on a large table.
func TestOperatorViewsAndIndexes(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open()
	s := e.session(c)
	ctx := context.Background()
	m := e.machine()
	w, _ := s.Work(ctx, "install", retrieveAll(m))
	if err := w.Fail(ctx, &testBackoff, "no disk"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Work(ctx, "inventory", retrieveAll(m)); err != nil {
		t.Fatal(err)
	}
	sessions, err := e.q.LiveSessionsList(ctx)
	if err != nil || len(sessions) != 1 || sessions[0].SecondsLeft <= 0 || sessions[0].SecondsLeft > 1 {
		t.Errorf("live_sessions = %+v, %v", sessions, err)
	}
	work, err := e.q.CurrentWorkForMachine(ctx, m)
	if err != nil || len(work) != 1 || work[0].Process != "inventory" || work[0].ComponentName != "test" || !work[0].Alive {
		t.Errorf("current_work = %+v, %v", work, err)
	}
	backoffs, err := e.q.ActiveBackoffsForMachine(ctx, m)
	if err != nil || len(backoffs) != 1 || backoffs[0].Cause != "no disk" || backoffs[0].SecondsLeft <= 0 {
		t.Errorf("active_backoffs = %+v, %v", backoffs, err)
	}
	status, err := e.q.MachineOverviewGet(ctx, m)
	if err != nil || status.LiveClaims != 1 || status.ExpiredClaims != 0 || status.ActiveBackoffs != 1 {
		t.Errorf("machine_overview = %+v, %v", status, err)
	}

	// 50k history rows over 5000 machines and 5 processes, a month of them.
	e.exec(`INSERT INTO work_history (machine_id, process, session_id, event, at, failed_cause)
		SELECT md5((i % 5000)::TEXT)::UUID, 'p' || (i % 5)::TEXT, gen_random_uuid(),
		       (CASE WHEN i % 7 = 0 THEN 'Failed' ELSE 'Finished' END)::work_history_event,
		       now() - (i * INTERVAL '1 minute'), NULL
		FROM generate_series(1, 50000) AS i`)
	e.exec("ANALYZE work_history")
	for _, tc := range []struct {
		name, index, query string
		args               []any
	}{
		{"history of one machine", "work_history_machine_idx|work_history_pair_idx",
			"SELECT * FROM readable_history WHERE machine_id = $1 ORDER BY at DESC, id DESC LIMIT 100", []any{m}},
		{"last hour of failures of a process", "work_history_process_idx|work_history_at_idx",
			"SELECT * FROM work_history WHERE process = $1 AND event = 'Failed' AND at >= now() - INTERVAL '1 hour' ORDER BY at DESC LIMIT 100", []any{"p3"}},
		// model.ReadableHistoryRecent: bmdbctl history without --machine.
		{"the fleet's recent history", "work_history_at_idx", fleetHistory, []any{nil, nil}},
		{"the fleet's recent history of a process", "work_history_at_idx", fleetHistory, []any{"p3", nil}},
	} {
		plan := explain(t, e, tc.query, tc.args...)
		usesIndex := false
		for _, index := range strings.Split(tc.index, "|") {
			// PostgreSQL: "Index Scan using IDX on work_history";
			// CockroachDB: "table: work_history@IDX".
			usesIndex = usesIndex || strings.Contains(plan, "using "+index) || strings.Contains(plan, "on "+index) ||
				strings.Contains(plan, "work_history@"+index)
		}
		if !usesIndex || strings.Contains(plan, "Seq Scan on work_history") || strings.Contains(plan, "FULL SCAN") {
			t.Errorf("%s does not use %s:\n%s", tc.name, tc.index, plan)
		}
		t.Logf("%s:\n%s", tc.name, plan)
	}
}

// fleetHistory is model.ReadableHistoryRecent's statement.
const fleetHistory = `SELECT * FROM readable_history
WHERE ($1::TEXT IS NULL OR process = $1::TEXT) AND ($2::TIMESTAMPTZ IS NULL OR at >= $2::TIMESTAMPTZ)
ORDER BY at DESC, id DESC LIMIT 100`

func explain(t *testing.T, e *env, query string, args ...any) string {
	t.Helper()
	rows, err := e.db.Query("EXPLAIN "+query, args...)
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
	return b.String()
}

// The statements that read one process's claims (a cap change's
// WorkSlotsAssign, the process_status view, a worker's drain count) read
// them through work_process_idx, not a scan of every process's claims: on
// CockroachDB such a scan waits on every claim in flight, while the cap
// change holds a write on the controls row every claim of the process
// reads. PostgreSQL is told to avoid sequential scans where it can, so
// that a plan without the index shows.
func TestOneProcessesClaimsReadByIndex(t *testing.T) {
	if testdb.Cockroach() {
		t.Skip("PostgreSQL's plans")
	}
	e := newEnv(t)
	e.exec(`INSERT INTO sessions (session_id, component_name, runtime_info, interval_seconds, deadline)
		VALUES ('00000000-0000-0000-0000-000000000001', 'x', '', 10, now() + INTERVAL '1 hour')`)
	e.exec(`INSERT INTO machines (machine_id) SELECT gen_random_uuid() FROM generate_series(1, 2000)`)
	e.exec(`INSERT INTO work (machine_id, process, session_id)
		SELECT machine_id, 'p' || (row_number() OVER () % 20)::TEXT, '00000000-0000-0000-0000-000000000001' FROM machines`)
	e.exec(`INSERT INTO process_controls (process) SELECT 'p' || i::TEXT FROM generate_series(0, 19) i`)
	e.exec("ANALYZE work")
	model, err := os.ReadFile("../queries/current_work.sql")
	if err != nil {
		t.Fatal(err)
	}
	_, left, _ := strings.Cut(string(model), "-- name: CurrentWorkLeftForProcess :one")
	left = strings.TrimSuffix(strings.TrimSpace(left[strings.Index(left, "\nSELECT")+1:]), ";")
	left = strings.ReplaceAll(strings.ReplaceAll(left, "sqlc.arg(process)", "$1"), "sqlc.arg(session_id)", "$2")
	for _, tc := range []struct {
		name, query string
		args        []any
	}{
		{"a cap change's WorkSlotsAssign", queryOf(t, "process_controls.sql", "WorkSlotsAssign"), []any{"p3"}},
		{"process_status", "SELECT * FROM process_status WHERE process = $1", []any{"p3"}},
		{"the drain's CurrentWorkLeftForProcess", left, []any{"p3", uuid.New()}},
	} {
		tx, err := e.db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec("SET LOCAL enable_seqscan = off"); err != nil {
			t.Fatal(err)
		}
		var plan strings.Builder
		rows, err := tx.Query("EXPLAIN "+tc.query, tc.args...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan.WriteString(line + "\n")
		}
		rows.Close()
		tx.Rollback()
		if strings.Contains(plan.String(), "Seq Scan on work ") || !strings.Contains(plan.String(), "work_process_idx") {
			t.Errorf("%s does not read one process's claims by work_process_idx:\n%s", tc.name, plan.String())
		}
	}
}

// Retention carries a keyset cursor across its batches and runs: each
// batch and each later run starts where the last got (every row dated
// before work_history_retention.pruned_before is gone), so that none reads
// again what an earlier one deleted; on CockroachDB deleted index entries
// stay for gc.ttlseconds, and reading from the start each batch was
// quadratic.
func TestPruneHistoryCarriesItsCursor(t *testing.T) {
	e := newWorkEnv(t)
	c := e.open()
	m := e.machine()
	ctx := context.Background()
	e.exec(`INSERT INTO work_history (machine_id, process, session_id, event, at)
		SELECT $1, 'install', gen_random_uuid(), 'Started', now() - INTERVAL '10 days' + (i * INTERVAL '1 minute')
		FROM generate_series(1, 300) AS i`, m)
	if n, err := c.PruneHistory(ctx, 24*time.Hour, 50); err != nil || n != 300 {
		t.Fatalf("PruneHistory = %d, %v; want the 300 old rows", n, err)
	}
	var prunedBefore, newestDeleted time.Time
	if err := e.db.QueryRow("SELECT pruned_before, now() - INTERVAL '10 days' + INTERVAL '300 minutes' FROM work_history_retention").Scan(&prunedBefore, &newestDeleted); err != nil {
		t.Fatal(err)
	}
	if d := prunedBefore.Sub(newestDeleted); d < -time.Second || d > time.Second {
		t.Errorf("pruned_before = %v, want the newest row deleted, %v", prunedBefore, newestDeleted)
	}
	// The next run starts there: rows dated after it are pruned, and the
	// statement reads the history from the cursor, not from its start.
	e.exec(`INSERT INTO work_history (machine_id, process, session_id, event, at)
		SELECT $1, 'install', gen_random_uuid(), 'Started', now() - INTERVAL '5 days' FROM generate_series(1, 5)`, m)
	if n, err := c.PruneHistory(ctx, 24*time.Hour, 50); err != nil || n != 5 {
		t.Errorf("the next run = %d, %v; want the 5 newer old rows", n, err)
	}
	if testdb.Cockroach() {
		return
	}
	plan := explainAnalyze(t, e, queryOf(t, "work_history.sql", "WorkHistoryPrune"), prunedBefore, (24 * time.Hour).Seconds(), 50)
	if !strings.Contains(plan, "Index Cond: ((at >= ") {
		t.Errorf("the prune statement does not start its scan at the cursor:\n%s", plan)
	}
}
