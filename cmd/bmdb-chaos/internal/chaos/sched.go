package chaos

import (
	"context"
	"database/sql"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/internal/wait"
)

// Measured delay. The checker's liveness bounds (reclaim.go) hold on an
// idle machine; on a loaded one (other processes on the same cores, the
// race detector) every step of a reclaim waits: for a CPU, and for the
// database, whose backends wait for one too. So each worker measures, on
// goroutines of their own, how long it waits, and records it in its
// history: how late a timer asked for every schedTick woke, the most per
// schedWindow (opSched records, the window's start and end as call and
// return, Late); and the round trip of a SELECT 1 every pingEvery, on a
// connection of its own through its proxy (opPing records, one per ping
// that took pingRecordMin or more), and how long opening that connection
// took when it had to be opened (opConnect). The harness widens each liveness
// bound by what the workers measured during the window it applies to
// (delays.during, liveness.allowed), rather than by a margin fixed in
// advance: a slow machine widens it by what it cost, an idle one keeps
// it tight.

const (
	schedTick     = 10 * time.Millisecond
	schedWindow   = 250 * time.Millisecond
	pingEvery     = 100 * time.Millisecond
	pingTimeout   = 10 * time.Second
	pingRecordMin = 2 * time.Millisecond
)

// probeScheduling records the worker's scheduling delay in rec until ctx
// is done. Runs on a goroutine of its own.
func probeScheduling(ctx context.Context, rec *recorder) {
	timer := time.NewTimer(schedTick)
	defer timer.Stop()
	start, worst := monotonic(), int64(0)
	for {
		asked := monotonic()
		timer.Reset(schedTick)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		now := monotonic()
		worst = max(worst, now-asked-schedTick.Nanoseconds())
		if now-start >= schedWindow.Nanoseconds() {
			rec.write(record{ID: rec.nextID(), Kind: opSched, Call: start, Return: now, Late: worst})
			start, worst = now, 0
		}
	}
}

// probeDatabase records the round trips of a SELECT 1 on a connection
// of db (the worker's own, through its proxy) in rec until ctx is done:
// those that succeed and take pingRecordMin or more (opPing), and apart
// from them the time it took to open each connection (opConnect): after a
// restart or a terminated backend, a transaction pays that once, not on
// every round trip. Runs on a goroutine of its own.
func probeDatabase(ctx context.Context, db *sql.DB, rec *recorder) {
	var conn *sql.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	measure := func(kind string, call int64, err error) {
		if ret := monotonic(); err == nil && ret-call >= pingRecordMin.Nanoseconds() {
			rec.write(record{ID: rec.nextID(), Kind: kind, Call: call, Return: ret, Late: ret - call})
		}
	}
	for wait.Sleep(ctx, pingEvery) == nil {
		pctx, cancel := context.WithTimeout(ctx, pingTimeout)
		var err error
		if conn == nil {
			call := monotonic()
			conn, err = db.Conn(pctx)
			measure(opConnect, call, err)
		}
		if err == nil {
			call := monotonic()
			_, err = conn.ExecContext(pctx, `SELECT 1`)
			measure(opPing, call, err)
			if err != nil {
				conn.Close() // a new one next time
				conn = nil
			}
		}
		cancel()
	}
}

// delays are the workers' measurements (opSched and opPing records), on
// the histories' clock (CLOCK_MONOTONIC).
type delays struct {
	sched, ping, connect measurements
	offset               int64 // CLOCK_REALTIME - CLOCK_MONOTONIC: database times to the histories' clock
}

// measurements are one kind of measurement, in order of their start.
type measurements struct {
	spans   []measured
	maxSpan int64 // the longest span, for searches
}

// measured is one measurement: a window's worst timer lateness, or one
// ping's round trip.
type measured struct {
	from, to int64 // CLOCK_MONOTONIC
	d        time.Duration
}

// newDelays takes the workers' measurements from ops, leaving out those a
// worker made during a fault aimed at it (faults, widened by schedWindow):
// a SIGSTOP, a cut network, killed connections make its own timers and
// pings late, not the machine's load.
func newDelays(ops []*op, faults []workerWindow, offset int64) *delays {
	d := &delays{offset: offset}
	pad := schedWindow.Nanoseconds()
	for _, o := range ops {
		var m *measurements
		switch o.Kind {
		case opSched:
			m = &d.sched
		case opPing:
			m = &d.ping
		case opConnect:
			m = &d.connect
		}
		if m == nil || o.Return == 0 {
			continue
		}
		faulted := false
		for _, f := range faults {
			if f.worker == o.Worker && o.Call < f.to.UnixNano()-offset+pad && f.from.UnixNano()-offset-pad < o.Return {
				faulted = true
				break
			}
		}
		if faulted {
			continue
		}
		m.spans = append(m.spans, measured{from: o.Call, to: o.Return, d: time.Duration(o.Late)})
		m.maxSpan = max(m.maxSpan, o.Return-o.Call)
	}
	for _, m := range []*measurements{&d.sched, &d.ping, &d.connect} {
		sort.Slice(m.spans, func(i, j int) bool { return m.spans[i].from < m.spans[j].from })
	}
	return d
}

// selfExpired returns the windows, on the database clock, in which a
// session expired by itself: its worker recorded its end as expired while
// no fault was aimed at that worker (faults, widened by schedWindow). Its
// heartbeats failed for the last half of its lifetime (half the
// interval, at most), so the window is that half before its end. Such a
// death is the direct evidence that the machine could not keep sessions
// alive, whatever the delays measured say (a heartbeat is a retried
// transaction, on CockroachDB paths longer than its 3 round trips), and
// the checker counts it as overload; the report counts the deaths, so
// that sessions dying on an idle machine (a heartbeat's bug) show.
func selfExpired(ops []*op, faults []workerWindow, offset int64, half time.Duration) (outageWindows, int) {
	var w outageWindows
	n := 0
	pad := schedWindow.Nanoseconds()
	for _, o := range ops {
		// Out is outExpired for a Close too (ErrSessionClosed): the cause
		// says which.
		if o.Kind != opSessionEnd || o.Return == 0 || !strings.Contains(o.Err, bmdb.ErrSessionExpired.Error()) {
			continue
		}
		faulted := false
		for _, f := range faults {
			if f.worker == o.Worker && o.Return-half.Nanoseconds() < f.to.UnixNano()-offset+pad && f.from.UnixNano()-offset-pad < o.Return {
				faulted = true
				break
			}
		}
		if faulted {
			continue
		}
		n++
		end := time.Unix(0, o.Return+offset)
		w = append(w, [2]time.Time{end.Add(-half), end})
	}
	return union(w, nil), n
}

// measuredDelays are the worst of each measurement in a window.
type measuredDelays struct {
	late, roundTrip, connect time.Duration
}

// heartbeatRoundTrips is what a session's heartbeat takes: a transaction
// of one statement (begin, the deadline's update, commit).
const heartbeatRoundTrips = 3

// heartbeat returns how long a heartbeat takes with these delays: its
// timer's lateness, a new connection, its round trips.
func (m measuredDelays) heartbeat() time.Duration {
	return m.late + m.connect + heartbeatRoundTrips*m.roundTrip
}

// overloaded returns the windows, on the database clock, in which the
// delays the workers measured (the worst of each per schedWindow) were
// more than a heartbeat can absorb: a session lives on only while a
// heartbeat, begun half its lifetime after the last one, succeeds within
// the other half (budget). Then no session can be expected to live, and
// bmdb promises no reclaim time: the checker counts those windows as it
// counts the database's outages.
func (d *delays) overloaded(budget time.Duration) outageWindows {
	lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
	for _, m := range []*measurements{&d.sched, &d.ping, &d.connect} {
		for _, s := range m.spans {
			lo, hi = min(lo, s.from), max(hi, s.to)
		}
	}
	var w outageWindows
	step := schedWindow.Nanoseconds()
	for t := lo; t < hi; t += step {
		m := measuredDelays{late: d.sched.worst(t, t+step), roundTrip: d.ping.worst(t, t+step), connect: d.connect.worst(t, t+step)}
		if m.heartbeat() < budget {
			continue
		}
		from, to := time.Unix(0, t+d.offset), time.Unix(0, t+step+d.offset)
		if n := len(w); n > 0 && !w[n-1][1].Before(from) {
			w[n-1][1] = to
			continue
		}
		w = append(w, [2]time.Time{from, to})
	}
	return w
}

// during returns the worst timer lateness, round trip and connection
// opening any worker measured in a span overlapping [from, to] (database
// times).
func (d *delays) during(from, to time.Time) measuredDelays {
	lo, hi := from.UnixNano()-d.offset, to.UnixNano()-d.offset
	return measuredDelays{late: d.sched.worst(lo, hi), roundTrip: d.ping.worst(lo, hi), connect: d.connect.worst(lo, hi)}
}

func (m *measurements) worst(lo, hi int64) time.Duration {
	i := sort.Search(len(m.spans), func(i int) bool { return m.spans[i].from >= lo-m.maxSpan })
	var worst time.Duration
	for ; i < len(m.spans) && m.spans[i].from <= hi; i++ {
		if s := m.spans[i]; s.to >= lo {
			worst = max(worst, s.d)
		}
	}
	return worst
}

// all returns every measurement, sorted: the run's distribution.
func (m *measurements) all() []time.Duration {
	out := make([]time.Duration, len(m.spans))
	for i, s := range m.spans {
		out[i] = s.d
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
