package chaos

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/internal/txn"
)

// check runs every check over the database, the workers' histories and
// their logs, adding violations and figures to r.
func (h *harness) check(ctx context.Context, r *Report) error {
	final, err := h.finalDeadlines(ctx)
	if err != nil {
		return err
	}
	events, err := h.events(ctx)
	if err != nil {
		return err
	}
	ops, err := readHistories(h.fleet.logDir, h.cfg.Workers)
	if err != nil {
		return err
	}
	offset := realtimeOffset()
	st := newStories(ops, events, offset)
	faults, err := h.workerFaults(ctx)
	if err != nil {
		return err
	}
	outages, err := h.outages(ctx)
	if err != nil {
		return err
	}
	d := newDelays(ops, faults, offset)
	expired, n := selfExpired(ops, faults, offset, h.cfg.Interval/2)
	overloaded := union(d.overloaded(h.cfg.Interval/2), expired)
	lb := &liveness{outages: union(outages, overloaded), delays: d, resume: resumeAfter(h.cfg.Interval)}
	r.SchedDelays, r.RoundTrips, r.Connects = d.sched.all(), d.ping.all(), d.connect.all()
	r.Overloaded, r.SelfExpired = overloaded.total(), n
	if err := h.checkItems(ctx, r); err != nil {
		return err
	}
	if err := h.checkEffects(ctx, r, final, st); err != nil {
		return err
	}
	if err := h.checkHistory(r, final, events, st, lb); err != nil {
		return err
	}
	if err := h.checkReclaims(ctx, r, final, events, lb); err != nil {
		return err
	}
	for _, w := range h.fleet.procs {
		h.checkLog(r, w)
	}
	r.Operations = checkModel(r, machineHistories(ops, events, offset), h.fleet.logDir)
	return nil
}

// events returns the work_history rows of Process, by machine and id, with
// their commit timestamps.
func (h *harness) events(ctx context.Context) ([]dbEvent, error) {
	rows, err := h.db.QueryContext(ctx, `
SELECT id, machine_id, session_id, COALESCE(claim_id, '00000000-0000-0000-0000-000000000000'), event::TEXT,
       fencing_token, at, xmin::TEXT, pg_xact_commit_timestamp(xmin)
FROM work_history WHERE process = $1 AND event IN ('Started', 'Finished', 'Failed', 'Canceled', 'Abandoned')
ORDER BY machine_id, id`, Process)
	if err != nil {
		return nil, fmt.Errorf("chaos: reading history: %w", err)
	}
	defer rows.Close()
	var evs []dbEvent
	for rows.Next() {
		var e dbEvent
		var token sql.NullInt64
		var commit sql.NullTime
		if err := rows.Scan(&e.id, &e.machine, &e.session, &e.claim, &e.event, &token, &e.at, &e.xid, &commit); err != nil {
			return nil, err
		}
		e.token, e.hasToken = token.Int64, token.Valid
		if !commit.Valid {
			return nil, fmt.Errorf("chaos: history %d has no commit timestamp (track_commit_timestamp off?)", e.id)
		}
		e.commit = commit.Time
		evs = append(evs, e)
	}
	return evs, rows.Err()
}

// finalDeadlines returns every session's last deadline (chaos_session_log).
func (h *harness) finalDeadlines(ctx context.Context) (map[uuid.UUID]time.Time, error) {
	rows, err := h.db.QueryContext(ctx, `SELECT session_id, max(deadline) FROM chaos_session_log GROUP BY session_id`)
	if err != nil {
		return nil, fmt.Errorf("chaos: reading session deadlines: %w", err)
	}
	defer rows.Close()
	m := map[uuid.UUID]time.Time{}
	for rows.Next() {
		var id uuid.UUID
		var t time.Time
		if err := rows.Scan(&id, &t); err != nil {
			return nil, err
		}
		m[id] = t
	}
	return m, rows.Err()
}

// checkItems: every item has exactly one effect row.
func (h *harness) checkItems(ctx context.Context, r *Report) error {
	err := h.db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM machines), (SELECT count(*) FROM chaos_effect),
		(SELECT count(DISTINCT machine_id) FROM chaos_effect)`).Scan(&r.Items, &r.Effects, &r.Processed)
	if err != nil {
		return fmt.Errorf("chaos: counting items: %w", err)
	}
	rows, err := h.db.QueryContext(ctx, `
SELECT m.machine_id, count(e.id),
       (SELECT string_agg(w.session_id::TEXT, ',') FROM work w WHERE w.machine_id = m.machine_id)
FROM machines m LEFT JOIN chaos_effect e ON e.machine_id = m.machine_id
GROUP BY m.machine_id HAVING count(e.id) <> 1 ORDER BY m.machine_id`)
	if err != nil {
		return fmt.Errorf("chaos: checking items: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var m uuid.UUID
		var n int
		var claims sql.NullString
		if err := rows.Scan(&m, &n, &claims); err != nil {
			return err
		}
		if n == 0 {
			when := "at the end of the drain: " + h.stuck[m]
			if h.stuck[m] == "" {
				when = fmt.Sprintf("claims held after shutdown: %q", claims.String)
			}
			r.violate("item %s stuck: no effect (%s)", m, when)
		} else {
			r.violate("item %s processed %d times", m, n)
		}
	}
	return rows.Err()
}

// checkEffects: each effect was committed by the Finish of the claim it
// names (a Finished history row of that claim, in the same transaction),
// at most once per claim, with the claim's fencing token, while the
// session was alive: the transaction began before the deadline it saw,
// and it committed before the session's final deadline.
func (h *harness) checkEffects(ctx context.Context, r *Report, final map[uuid.UUID]time.Time, st *stories) error {
	rows, err := h.db.QueryContext(ctx, `
SELECT e.id, e.machine_id, e.session_id, e.worker_id, e.claim_id, e.token, e.tx_now, e.stmt_clock, e.seen_deadline,
       e.xmin::TEXT, pg_xact_commit_timestamp(e.xmin), count(*) OVER (PARTITION BY e.claim_id)
FROM chaos_effect e ORDER BY e.id`)
	if err != nil {
		return fmt.Errorf("chaos: reading effects: %w", err)
	}
	defer rows.Close()
	first := true
	for rows.Next() {
		var id int64
		var m, s, c uuid.UUID
		var wid, perClaim int
		var token int64
		var started sql.NullInt64
		var txNow, stmt time.Time
		var seen, commit sql.NullTime
		var xid string
		if err := rows.Scan(&id, &m, &s, &wid, &c, &token, &txNow, &stmt, &seen, &xid, &commit, &perClaim); err != nil {
			return err
		}
		// The claim's history, read by events: its Started row, and a
		// Finished row of the effect's session and transaction.
		var finished, hasStarted bool
		for _, e := range st.events[c] {
			switch {
			case e.event == "Started" && !hasStarted:
				hasStarted, started = true, sql.NullInt64{Int64: e.token, Valid: e.hasToken}
			case e.event == "Finished" && e.session == s && e.xid == xid:
				finished = true
			}
		}
		what := fmt.Sprintf("effect %d (item %s, claim %s, session %s, worker %d)", id, m, c, s, wid)
		fd, ok := final[s]
		switch {
		case !finished:
			r.violate("%s was not committed with its claim's Finished history: committed without holding the claim%s", what, st.of(c))
		case perClaim > 1:
			r.violate("%s is one of %d effects of its claim%s", what, perClaim, st.of(c))
		case !started.Valid || started.Int64 != token:
			r.violate("%s carries token %d, its claim's Started history %v%s", what, token, started, st.of(c))
		case !seen.Valid:
			r.violate("%s: its transaction saw no row for its session", what)
		case !txNow.Before(seen.Time):
			r.violate("%s: transaction began at %s, not before the deadline it saw %s", what, ts(txNow), ts(seen.Time))
		case !ok:
			r.violate("%s: session has no recorded deadline", what)
		case !commit.Valid:
			r.violate("%s: no commit timestamp (track_commit_timestamp off?)", what)
		case !commit.Time.Before(fd):
			r.violate("%s committed at %s, %v after its session's final deadline %s (statement ran at %s, transaction began %s)%s",
				what, ts(commit.Time), commit.Time.Sub(fd), ts(fd), ts(stmt), ts(txNow), st.of(c))
		}
		if ok && commit.Valid {
			if margin := fd.Sub(commit.Time); first || margin < r.MinCommitMargin {
				r.MinCommitMargin, first = margin, false
			}
		}
	}
	return rows.Err()
}

// checkHistory: per machine, claims follow one another without overlap
// (each Started is ended by its own session's event before the next
// Started); what a session's own transactions wrote (Started, Finished,
// Failed) committed before its final deadline; a claim is Abandoned only
// after its session's final deadline, and within the release bound of it
// (liveness); no claim is left open.
func (h *harness) checkHistory(r *Report, final map[uuid.UUID]time.Time, events []dbEvent, st *stories, lb *liveness) error {
	r.Events = map[string]int{}
	claiming := map[string]bool{} // transactions that wrote a Started row: claims
	for _, e := range events {
		if e.event == "Started" {
			claiming[e.xid] = true
		}
	}
	var holder *dbEvent
	var last uuid.UUID
	for i := range events {
		e := &events[i]
		r.Events[e.event]++
		if e.machine != last {
			if holder != nil {
				r.violate("item %s: claim of session %s (Started %s) never ended", last, holder.session, ts(holder.at))
			}
			holder, last = nil, e.machine
		}
		if e.event != "Abandoned" && e.event != "Canceled" {
			if fd, ok := final[e.session]; ok && !e.commit.Before(fd) {
				r.violate("item %s: %s history of claim %s committed at %s, %v after its session's final deadline %s%s",
					e.machine, e.event, e.claim, ts(e.commit), e.commit.Sub(fd), ts(fd), st.of(e.claim))
			}
		}
		if e.event == "Started" {
			if holder != nil {
				r.violate("item %s: session %s Started at %s while session %s held the claim (Started %s)",
					e.machine, e.session, ts(e.at), holder.session, ts(holder.at))
			}
			holder = e
			continue
		}
		if holder == nil || holder.session != e.session {
			r.violate("item %s: %s by session %s (history %d) which did not hold the claim", e.machine, e.event, e.session, e.id)
			holder = nil
			continue
		}
		if e.event == "Abandoned" {
			fd, ok := final[e.session]
			switch {
			case !ok:
				r.violate("item %s: Abandoned claim of session %s with no recorded deadline", e.machine, e.session)
			case e.at.Before(fd):
				r.violate("item %s: claim of session %s Abandoned at %s, before the session's deadline %s: two live claims",
					e.machine, e.session, ts(e.at), ts(fd))
			default:
				lat := e.at.Sub(fd)
				r.Releases = append(r.Releases, lat)
				if claiming[e.xid] {
					r.ReleasedByClaims++
				}
				if allowed, why := lb.allowed(r.ReleaseBound, fd, e.at); lat > allowed {
					r.violate("item %s: claim of session %s released (Abandoned) %v after the session's deadline %s, more than %v (%s)",
						e.machine, e.session, lat.Round(time.Millisecond), ts(fd), allowed.Round(time.Millisecond), why)
				}
			}
		}
		holder = nil
	}
	if holder != nil {
		r.violate("item %s: claim of session %s (Started %s) never ended", last, holder.session, ts(holder.at))
	}
	sort.Slice(r.Releases, func(i, j int) bool { return r.Releases[i] < r.Releases[j] })
	return nil
}

// reclaimsFile is the file in the log directory that lists every
// reclaim: machine, session, deadline, next Started, the wall and counted
// times, and what its allowance adds for outages (the database's, and
// overload) and for the delays measured.
const reclaimsFile = "reclaims.tsv"

// checkReclaims: every machine a dead session held is worked again
// within the reclaim bound of the session's deadline, counting only the
// time during which free machines remained (reclaim.go) (liveness).
func (h *harness) checkReclaims(ctx context.Context, r *Report, final map[uuid.UUID]time.Time, events []dbEvent, lb *liveness) error {
	none, err := h.noneFree(ctx, events)
	if err != nil {
		return err
	}
	rs, unknown := reclaims(events, final, none)
	for _, c := range unknown {
		r.violate("claim %s: Abandoned, and its session has no recorded deadline", c)
	}
	var tsv strings.Builder
	tsv.WriteString("machine\tsession\tdeadline\tstarted\twall_ms\tcounted_ms\toutage_ms\tdelay_ms\tallowed_ms\n")
	for _, rc := range rs {
		allowed, why := lb.allowed(r.ReclaimBound, rc.deadline, rc.started)
		fmt.Fprintf(&tsv, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\n", rc.machine, rc.session, ts(rc.deadline), ts(rc.started),
			rc.started.Sub(rc.deadline).Milliseconds(), rc.counted.Milliseconds(), lb.outages.overlap(rc.deadline, rc.started).Milliseconds(),
			lb.delayOf(rc.deadline, rc.started).Milliseconds(), allowed.Milliseconds())
		r.Reclaims = append(r.Reclaims, rc.counted)
		r.ReclaimWall = max(r.ReclaimWall, rc.started.Sub(rc.deadline))
		if rc.counted > allowed {
			r.violate("item %s: worked again (Started committed %s) %v after the deadline %s of session %s, counting only time with free machines, more than %v (%s)",
				rc.machine, ts(rc.started), rc.counted.Round(time.Millisecond), ts(rc.deadline), rc.session, allowed.Round(time.Millisecond), why)
		}
	}
	if h.fleet != nil {
		// Every reclaim with its allowance, for a closer look.
		if err := os.WriteFile(filepath.Join(h.fleet.logDir, reclaimsFile), []byte(tsv.String()), 0o644); err != nil {
			return fmt.Errorf("chaos: writing %s: %w", reclaimsFile, err)
		}
	}
	sort.Slice(r.Reclaims, func(i, j int) bool { return r.Reclaims[i] < r.Reclaims[j] })
	return nil
}

// liveness widens a liveness bound by what the run measured over the
// window it applies to: the time the database was down or the work table
// locked, or the machine overloaded (delays.overloaded), and the delays
// the workers measured (sched.go).
type liveness struct {
	outages outageWindows // the database's outages and the overloaded windows, merged
	delays  *delays
	resume  time.Duration // allowed after each outage for the fleet to resume (resumeAfter)
}

// What a liveness bound allows for each delay measured in its window:
// the critical path of a reclaim is one claim transaction that takes the
// dead session over (its begin, retrieval, claim statement, the session's
// lock, the Abandoned rows, the session's delete, the claim again, the
// commit: roundTrips round trips, each of which may take as long as the
// longest measured then, and at most one new connection), started by a
// few goroutine wake-ups (the handler's timer, the claim loop, the
// batcher, the transaction: wakeUps, each as late as the worst measured
// then).
const (
	roundTrips = 8
	wakeUps    = 4
)

// allowance is what delays measured in a window add to a bound.
func (m measuredDelays) allowance() time.Duration {
	return wakeUps*m.late + roundTrips*m.roundTrip + m.connect
}

// delayOf returns what the delays measured over [from, to] add to a bound.
func (lb *liveness) delayOf(from, to time.Time) time.Duration {
	return lb.delays.during(from, to).allowance()
}

// resumeAfter is how late a fleet of sessions of interval may resume
// claiming after an outage or overload ends: a session that expired
// during it is replaced (its loop closes it and starts another, retrying
// every 100 ms: an interval at most), a claim loop that failed meanwhile
// may be asleep for its longest poll (pollMax), and the transaction that
// fails first waits up to the runner's longest retry delay before its
// next attempt.
func resumeAfter(interval time.Duration) time.Duration { return interval + pollMax + txn.RetryCap }

// allowed returns bound widened for the window [from, to], and how.
func (lb *liveness) allowed(bound time.Duration, from, to time.Time) (time.Duration, string) {
	out := lb.outages.overlap(from, to)
	// The fleet resumes after each outage that ended in the window or
	// shortly before it.
	var resume time.Duration
	for _, w := range lb.outages {
		if w[1].After(from.Add(-lb.resume)) && w[0].Before(to) {
			resume += lb.resume
		}
	}
	m := lb.delays.during(from, to)
	return bound + out + resume + m.allowance(), fmt.Sprintf("bound %v, + %v database outage or overload and %v resuming after it, + %d x %v timer lateness + %d x %v round trip + %v connecting, the worst measured then",
		bound, out.Round(time.Millisecond), resume, wakeUps, m.late.Round(time.Millisecond), roundTrips, m.roundTrip.Round(time.Millisecond), m.connect.Round(time.Millisecond))
}

// outageWindows are the database's restarts and the operator's locks of
// the work table, on its clock: no one can reclaim anything then (and,
// in other uses, windows of other kinds).
type outageWindows [][2]time.Time

// union returns the windows of a and b, merged, in order.
func union(a, b outageWindows) outageWindows {
	all := append(append(outageWindows(nil), a...), b...)
	sort.Slice(all, func(i, j int) bool { return all[i][0].Before(all[j][0]) })
	var u outageWindows
	for _, w := range all {
		if n := len(u); n > 0 && !u[n-1][1].Before(w[0]) {
			if w[1].After(u[n-1][1]) {
				u[n-1][1] = w[1]
			}
			continue
		}
		u = append(u, w)
	}
	return u
}

// total returns how long the windows last together (they do not overlap).
func (o outageWindows) total() time.Duration {
	var d time.Duration
	for _, w := range o {
		d += w[1].Sub(w[0])
	}
	return d
}

// outages returns the database's restarts and the operator's locks of
// the work table (FaultPGRestart, FaultLockTable), on its clock.
func (h *harness) outages(ctx context.Context) (outageWindows, error) {
	rows, err := h.db.QueryContext(ctx, `SELECT began_at, ended_at FROM chaos_fault WHERE kind IN ($1, $2) AND ended_at IS NOT NULL`,
		string(FaultPGRestart), string(FaultLockTable))
	if err != nil {
		return nil, fmt.Errorf("chaos: reading faults: %w", err)
	}
	defer rows.Close()
	var o outageWindows
	for rows.Next() {
		var w [2]time.Time
		if err := rows.Scan(&w[0], &w[1]); err != nil {
			return nil, err
		}
		o = append(o, w)
	}
	return o, rows.Err()
}

// overlap returns how long the windows cover between from and to: no one
// can reclaim anything then.
func (o outageWindows) overlap(from, to time.Time) time.Duration {
	var d time.Duration
	for _, w := range o {
		lo, hi := w[0], w[1]
		if lo.Before(from) {
			lo = from
		}
		if hi.After(to) {
			hi = to
		}
		if hi.After(lo) {
			d += hi.Sub(lo)
		}
	}
	return d
}

var (
	reClaimed = regexp.MustCompile(regexp.QuoteMeta(logClaimed) + ` (\S+) session (\S+)`)
	reDone    = regexp.MustCompile(`(?:` + regexp.QuoteMeta(logDone) + `|` + regexp.QuoteMeta(logStop) + `) (\S+) session`)
	reLost    = regexp.MustCompile(`claim of (\S+) lost`)
	reEnded   = regexp.MustCompile(`session \S+ .*ended|claim of \S+ lost`)
	reCrash   = regexp.MustCompile(`WARNING: DATA RACE|^panic: |fatal error: `)
)

// checkLog reads a worker's log: no race report or panic; after every
// stall, each machine that was mid-work when the worker stopped is reported
// lost (never finished), and after every stall and partition the session is
// seen to end.
func (h *harness) checkLog(r *Report, w *proc) {
	f, err := os.Open(w.logPath)
	if err != nil {
		r.violate("worker %d: reading log: %v", w.cfg.ID, err)
		return
	}
	defer f.Close()
	inflight := map[string]bool{} // claimed, work not done
	var (
		stalled map[string]bool // in flight when stopped, not yet reported lost
		woke    bool            // after SIGCONT
		needEnd bool            // after a stall or partition, until the session is seen to end
		event   string          // the last stall or partition, for messages
	)
	flush := func() {
		for m := range stalled {
			r.violate("worker %d: item %s was mid-work at %s but its claim was never reported lost afterwards (log %s)", w.cfg.ID, m, event, w.logPath)
		}
		if needEnd {
			r.violate("worker %d: no session end or lost claim logged after %s (log %s)", w.cfg.ID, event, w.logPath)
		}
		stalled, woke, needEnd = nil, false, false
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if reCrash.MatchString(line) {
			r.violate("worker %d: %s (log %s)", w.cfg.ID, line, w.logPath)
		}
		if rest, ok := strings.CutPrefix(line, "chaos-harness: "); ok {
			switch {
			case strings.Contains(rest, " start #"):
				flush()
				inflight = map[string]bool{}
			case strings.Contains(rest, " "+markStop):
				flush()
				event = "SIGSTOP at " + strings.Fields(rest)[0]
				stalled = map[string]bool{}
				for m := range inflight {
					stalled[m] = true
				}
			case strings.Contains(rest, " "+markCont):
				woke, needEnd = true, true
			case strings.Contains(rest, " "+markCut):
				flush()
				event = "partition at " + strings.Fields(rest)[0]
				needEnd = true
			}
			continue
		}
		if m := reClaimed.FindStringSubmatch(line); m != nil {
			inflight[m[1]] = true
		}
		if m := reDone.FindStringSubmatch(line); m != nil {
			delete(inflight, m[1])
		}
		if m := reLost.FindStringSubmatch(line); m != nil {
			delete(inflight, m[1])
			if woke {
				delete(stalled, m[1])
			}
		}
		if needEnd && reEnded.MatchString(line) {
			needEnd = false
		}
	}
	if err := sc.Err(); err != nil {
		r.violate("worker %d: reading log: %v", w.cfg.ID, err)
	}
	flush()
}

// ts formats a database timestamp for messages.
func ts(t time.Time) string { return t.Format("15:04:05.000000") }
