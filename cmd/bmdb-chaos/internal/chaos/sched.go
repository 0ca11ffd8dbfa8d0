package chaos

import (
	"context"
	"database/sql"
	"sort"
	"time"

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
// that took pingRecordMin or more). The harness widens each liveness
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

// probeDatabase records the round trips of a SELECT 1 on db (one
// connection of the worker's own) in rec until ctx is done: those that
// succeed and take pingRecordMin or more. Runs on a goroutine of its own.
func probeDatabase(ctx context.Context, db *sql.DB, rec *recorder) {
	for wait.Sleep(ctx, pingEvery) == nil {
		pctx, cancel := context.WithTimeout(ctx, pingTimeout)
		call := monotonic()
		_, err := db.ExecContext(pctx, `SELECT 1`)
		ret := monotonic()
		cancel()
		if err == nil && ret-call >= pingRecordMin.Nanoseconds() {
			rec.write(record{ID: rec.nextID(), Kind: opPing, Call: call, Return: ret, Late: ret - call})
		}
	}
}

// delays are the workers' measurements (opSched and opPing records), on
// the histories' clock (CLOCK_MONOTONIC).
type delays struct {
	sched, ping measurements
	offset      int64 // CLOCK_REALTIME - CLOCK_MONOTONIC: database times to the histories' clock
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
		if (o.Kind != opSched && o.Kind != opPing) || o.Return == 0 {
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
		m := &d.sched
		if o.Kind == opPing {
			m = &d.ping
		}
		m.spans = append(m.spans, measured{from: o.Call, to: o.Return, d: time.Duration(o.Late)})
		m.maxSpan = max(m.maxSpan, o.Return-o.Call)
	}
	for _, m := range []*measurements{&d.sched, &d.ping} {
		sort.Slice(m.spans, func(i, j int) bool { return m.spans[i].from < m.spans[j].from })
	}
	return d
}

// during returns the worst timer lateness and the longest round trip any
// worker measured in a span overlapping [from, to] (database times).
func (d *delays) during(from, to time.Time) (late, roundTrip time.Duration) {
	lo, hi := from.UnixNano()-d.offset, to.UnixNano()-d.offset
	return d.sched.worst(lo, hi), d.ping.worst(lo, hi)
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
