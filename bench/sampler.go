package main

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"io"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/lib/pq"
)

// sampleSQL lists the backends of the bench database other than the
// sampler's own that are doing something (active, or idle in a
// transaction): their process (application_name), what they wait on, their
// statement, how long they have waited for a lock (pg_locks.waitstart,
// PostgreSQL 14+), and who blocks them.
const sampleSQL = `
SELECT a.pid, a.application_name, a.state, coalesce(a.wait_event_type, ''), coalesce(a.wait_event, ''),
       left(a.query, 300), l.waitstart,
       coalesce(extract(epoch FROM now() - l.waitstart), 0)::FLOAT8,
       CASE WHEN a.wait_event_type = 'Lock' THEN pg_blocking_pids(a.pid) END
FROM pg_stat_activity a
LEFT JOIN LATERAL (SELECT min(p.waitstart) AS waitstart FROM pg_locks p WHERE p.pid = a.pid AND NOT p.granted) l ON true
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
  AND a.backend_type = 'client backend' AND a.state <> 'idle'`

// backend is one row of sampleSQL.
type backend struct {
	pid                  int64
	app, state, waitType string
	waitEvent, query     string
	waitStart            sql.NullTime
	waited               float64 // seconds waited for a lock so far
	blockers             []int64
}

// waitTally is what samplers saw, over one or more runs.
type waitTally struct {
	interval time.Duration
	samples  int
	errs     int
	waits    map[[2]string]int  // (statement, wait) -> backends seen
	blocked  map[[4]string]int  // (waiter statement, blocker statement, blocker state, same/other process) -> seen
	episodes map[string]float64 // lock wait (pid, waitstart) -> longest wait seen, seconds
}

func newWaitTally(interval time.Duration) *waitTally {
	return &waitTally{interval: interval, waits: map[[2]string]int{}, blocked: map[[4]string]int{}, episodes: map[string]float64{}}
}

// sampler polls sampleSQL every interval until finished, into a tally.
type sampler struct {
	db   *sql.DB
	stop chan struct{}
	done chan struct{}

	// Written by the sampling goroutine, read after done.
	*waitTally
	apps map[int64]string // pid -> application_name, of every backend seen in this run
}

func startSampler(db *sql.DB, t *waitTally) *sampler {
	s := &sampler{db: db, stop: make(chan struct{}), done: make(chan struct{}), waitTally: t, apps: map[int64]string{}}
	go s.run()
	return s
}

func (s *sampler) run() {
	defer close(s.done)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if err := s.sample(); err != nil {
			s.errs++
		}
	}
}

// finish stops the sampler and waits for it.
func (s *sampler) finish() {
	close(s.stop)
	<-s.done
}

func (s *sampler) sample() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, sampleSQL)
	if err != nil {
		return err
	}
	defer rows.Close()
	var bs []backend
	for rows.Next() {
		var b backend
		var blockers pq.Int64Array
		if err := rows.Scan(&b.pid, &b.app, &b.state, &b.waitType, &b.waitEvent, &b.query, &b.waitStart, &b.waited, &blockers); err != nil {
			return err
		}
		b.blockers = blockers
		bs = append(bs, b)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	s.samples++
	byPid := map[int64]backend{}
	for _, b := range bs {
		byPid[b.pid] = b
		s.apps[b.pid] = b.app
	}
	for _, b := range bs {
		stmt := statementLabel(b.query)
		s.waits[[2]string{stmt, waitLabel(b)}]++
		if b.waitStart.Valid {
			key := fmt.Sprint(b.pid, b.waitStart.Time.UnixNano())
			s.episodes[key] = max(s.episodes[key], b.waited)
		}
		for _, p := range b.blockers {
			blocker, ok := byPid[p]
			bstmt, bstate, who := "?", "gone", "?"
			if ok {
				bstmt, bstate, who = statementLabel(blocker.query), blocker.state, "other process"
				if blocker.app == b.app {
					who = "same process"
				}
			}
			s.blocked[[4]string{stmt, bstmt, bstate, who}]++
		}
	}
	return nil
}

// waitLabel is what a backend was doing: wait_event_type:wait_event, or
// "on CPU" for an active backend waiting on nothing, or its state when it
// is not active (idle in transaction: waiting for its client).
func waitLabel(b backend) string {
	switch {
	case b.state != "active":
		return b.state
	case b.waitType != "":
		return b.waitType + ":" + b.waitEvent
	}
	return "on CPU"
}

var (
	sqlcName = regexp.MustCompile(`^--\s*name:\s*(\w+)`)
	spaces   = regexp.MustCompile(`\s+`)
)

// print writes the sampler's tallies: backends per statement and wait, who
// blocked lock waiters, and the lock waits' lengths.
func (s *waitTally) print(out io.Writer, top int) {
	fmt.Fprintf(out, "pg_stat_activity every %v: %d samples (%d failed); backends seen per statement and wait (top %d):\n",
		s.interval, s.samples, s.errs, top)
	t := newTable(out, "statement", "wait", "seen", "per sample")
	for _, k := range topKeys(s.waits, top) {
		t.row(k[0], k[1], fmt.Sprint(s.waits[k]), f2(float64(s.waits[k])/float64(max(s.samples, 1))))
	}
	t.flush()
	if len(s.blocked) > 0 {
		fmt.Fprintln(out, "lock waiters and their blockers (pg_blocking_pids):")
		t := newTable(out, "waiter statement", "blocker's last statement", "blocker state", "blocker", "seen")
		for _, k := range topKeys(s.blocked, top) {
			t.row(k[0], k[1], k[2], k[3], fmt.Sprint(s.blocked[k]))
		}
		t.flush()
	}
	if len(s.episodes) > 0 {
		var l latencies
		for _, v := range s.episodes {
			l = append(l, time.Duration(v*float64(time.Second)))
		}
		fmt.Fprintf(out, "lock waits sampled: %d, longest seen so far when sampled: p50 %s, p90 %s, max %s (lower bounds of their lengths)\n",
			len(l), ms(l.pct(50)), ms(l.pct(90)), ms(l.pct(100)))
	}
}

// topKeys returns the n keys of m with the largest values.
func topKeys[K comparable](m map[K]int, n int) []K {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b K) int {
		if c := cmp.Compare(m[b], m[a]); c != 0 {
			return c
		}
		return strings.Compare(fmt.Sprint(a), fmt.Sprint(b))
	})
	return keys[:min(n, len(keys))]
}

// serverLog reads the errors the server logged during a run, from its log
// file through pg_read_file (superuser or pg_read_server_files only). By
// default the file is scripts/pg-start's: server.log beside the data
// directory.
type serverLog struct {
	db     *sql.DB
	file   string
	offset int64
}

// openServerLog finds the log file (file, or "" for pg-start's) and its
// current size; it returns nil if it cannot be read.
func openServerLog(ctx context.Context, db *sql.DB, file string) *serverLog {
	if file == "off" {
		return nil
	}
	if file == "" {
		var dir string
		if err := db.QueryRowContext(ctx, `SELECT current_setting('data_directory')`).Scan(&dir); err != nil {
			return nil
		}
		file = path.Join(path.Dir(dir), "server.log")
	}
	l := &serverLog{db: db, file: file}
	if err := db.QueryRowContext(ctx, `SELECT size FROM pg_stat_file($1)`, file).Scan(&l.offset); err != nil {
		return nil
	}
	return l
}

var (
	logLine = regexp.MustCompile(`^\S+ \S+ \S+ \[(\d+)\] (ERROR|STATEMENT):\s+(.*)$`)
	// errorCauses names the retryable errors by message (lc_messages C).
	errorCauses = []struct{ code, text string }{
		{"40001", "could not serialize access"},
		{"55P03", "canceling statement due to lock timeout"},
		{"40P01", "deadlock detected"},
		{"55P03", "could not obtain lock"},
	}
)

// logError is one ERROR of the server log: its backend, SQLSTATE (from the
// message) and the statement it failed (the following STATEMENT line).
type logError struct {
	pid       int64
	code, msg string
	statement string
}

// errorsSince returns the errors logged since openServerLog.
func (l *serverLog) errorsSince(ctx context.Context) ([]logError, error) {
	var text string
	err := l.db.QueryRowContext(ctx, `SELECT pg_read_file($1, $2, (SELECT size FROM pg_stat_file($1)) - $2)`, l.file, l.offset).Scan(&text)
	if err != nil {
		return nil, err
	}
	var out []logError
	last := map[int64]int{} // pid -> index in out of its last ERROR
	stmtOf := -1            // index in out whose STATEMENT is being read
	for _, line := range strings.Split(text, "\n") {
		m := logLine.FindStringSubmatch(line)
		if m == nil {
			// A continuation line (tab-indented) of a statement whose
			// first line was empty, as the bench's own are.
			if stmtOf >= 0 && out[stmtOf].statement == "" && strings.TrimSpace(line) != "" {
				out[stmtOf].statement = statementLabel(line)
			}
			continue
		}
		stmtOf = -1
		var pid int64
		fmt.Sscan(m[1], &pid)
		if m[2] == "STATEMENT" {
			if i, ok := last[pid]; ok && out[i].statement == "" {
				out[i].statement = statementLabel(m[3])
				stmtOf = i
			}
			delete(last, pid)
			continue
		}
		e := logError{pid: pid, code: "other", msg: m[3]}
		for _, c := range errorCauses {
			if strings.Contains(m[3], c.text) {
				e.code = c.code
				break
			}
		}
		last[pid] = len(out)
		out = append(out, e)
	}
	return out, nil
}

// errorTally counts errors by (code, statement) and by process.
type errorTally struct {
	byCause   map[[2]string]int
	byProcess map[string]map[string]int // application_name -> code -> count
}

func (t *errorTally) add(es []logError, apps map[int64]string) {
	if t.byCause == nil {
		t.byCause, t.byProcess = map[[2]string]int{}, map[string]map[string]int{}
	}
	for _, e := range es {
		code := e.code
		switch {
		case code == "other":
			code = "other: " + statementLabel(e.msg)
		case code == "40001":
			// "due to concurrent update" (a row another transaction
			// changed) or "due to read/write dependencies" (SSI).
			_, why, _ := strings.Cut(e.msg, " due to ")
			code += " " + why
		}
		t.byCause[[2]string{code, e.statement}]++
		app := apps[e.pid]
		if app == "" {
			app = "?"
		}
		if t.byProcess[app] == nil {
			t.byProcess[app] = map[string]int{}
		}
		t.byProcess[app][e.code]++
	}
}
