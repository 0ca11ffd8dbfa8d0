package bmdb

import (
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bmdb-dev/bmdb/internal/counters"
)

// Metrics are bmdb's Prometheus collectors. Create them once per registry
// with NewMetrics and pass them to every Connection in Config.Metrics; the
// component label tells connections apart (Connections of one component
// are summed). The counters are the Connections' own (Connection.Stats
// reads the same numbers), read at each scrape. bmdb registers nothing
// globally.
//
// Exported series (all with label component):
//
//	bmdb_sessions_started_total, bmdb_sessions_expired_total
//	bmdb_heartbeat_duration_seconds (histogram), bmdb_heartbeat_failures_total
//	bmdb_transaction_attempts_total, bmdb_transaction_retries_total{reason}
//	bmdb_work_events_total{process, event}   Started, Finished, Failed, Canceled, Abandoned, BackoffCleared
//	bmdb_work_conflicts_total{process}
//	bmdb_work_nothing_to_do_total{process}
//	bmdb_work_paused_total{process}          Work calls that found the process paused (ErrProcessPaused)
//	bmdb_work_capped_total{process}          Work calls that found it at its cap (ErrCapReached)
//	bmdb_process_paused{process}             gauge: 1 if the process was paused at this component's last claim statement
//	bmdb_process_claim_cap{process}          gauge: its cap then, 0 for none
//	bmdb_work_asked_total{process}           machines asked for by Work and WorkMany (vs Started: claimed)
//	bmdb_claims_stale_total{process}         claim statements that met a stale candidate (Stats.ClaimsStale)
//	bmdb_claim_duration_seconds{process}     (histogram of successful Work calls)
//	bmdb_backoffs_total{process}
type Metrics struct {
	// The histograms, observed by the Connections.
	heartbeatSeconds *prometheus.HistogramVec
	claimSeconds     *prometheus.HistogramVec

	mu    sync.Mutex
	conns []*metricSource // guarded by mu: every Connection opened with these metrics, closed ones included
}

// metricSource is a Connection's counters under its component name.
type metricSource struct {
	component string
	c         *counters.Counters
}

// NewMetrics creates bmdb's collectors and registers them with reg. It
// fails if reg already has collectors of the same names. A nil reg gives
// metrics that are kept but exported nowhere.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	latency := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}
	m := &Metrics{
		heartbeatSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "bmdb_heartbeat_duration_seconds", Help: "Duration of successful heartbeats.", Buckets: latency}, []string{"component"}),
		claimSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "bmdb_claim_duration_seconds", Help: "Duration of successful Work calls, retries included.", Buckets: latency},
			[]string{"component", "process"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.heartbeatSeconds, m.claimSeconds, (*countersCollector)(m)} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("bmdb: registering metrics: %w", err)
			}
		}
	}
	return m, nil
}

// add makes c's counters part of the metrics, under component.
func (m *Metrics) add(component string, c *counters.Counters) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.conns = append(m.conns, &metricSource{component: component, c: c})
}

// The counters' series: help, and labels besides component.
var (
	descSessionsStarted   = counterDesc("bmdb_sessions_started_total", "Sessions started.")
	descSessionsExpired   = counterDesc("bmdb_sessions_expired_total", "Sessions that ended by expiry rather than Close.")
	descHeartbeatFailures = counterDesc("bmdb_heartbeat_failures_total", "Failed heartbeat attempts.")
	descTxAttempts        = counterDesc("bmdb_transaction_attempts_total", "Transaction attempts, first tries and retries.")
	descTxRetries         = counterDesc("bmdb_transaction_retries_total", "Transaction attempts retried, by reason: serialization failure, lock_timeout, deadlock, or connection failure before COMMIT.", "reason")
	descWorkEvents        = counterDesc("bmdb_work_events_total", "Committed work history events by process and event.", "process", "event")
	descWorkConflicts     = counterDesc("bmdb_work_conflicts_total", "Work calls that found only machines claimed, or being claimed, by other sessions.", "process")
	descWorkNothing       = counterDesc("bmdb_work_nothing_to_do_total", "Work calls that found nothing to claim.", "process")
	descWorkPaused        = counterDesc("bmdb_work_paused_total", "Work calls that found the process paused.", "process")
	descWorkCapped        = counterDesc("bmdb_work_capped_total", "Work calls that found the process at its cap of live claims.", "process")
	descWorkAsked         = counterDesc("bmdb_work_asked_total", "Machines asked for by Work and WorkMany calls (their limits).", "process")
	descClaimsStale       = counterDesc("bmdb_claims_stale_total", "Claim statements that met a candidate claimed or ended after their snapshot, and ran again.", "process")
	descBackoffs          = counterDesc("bmdb_backoffs_total", "Backoffs set by Fail.", "process")
	descClaimsTakenOver   = counterDesc("bmdb_claims_taken_over_total", "Claims of expired sessions that this component's claims ended (Abandoned) to take their machines or slots.", "process")
)

// Gauges of each process's controls, as the last claim statement of a
// component saw them (Connections of one component: the highest).
var (
	descProcessPaused = counterDesc("bmdb_process_paused", "1 if the process was paused at this component's last claim statement of it, else 0.", "process")
	descProcessCap    = counterDesc("bmdb_process_claim_cap", "The process's cap of live claims at this component's last claim statement of it, 0 for none.", "process")
)

func counterDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, append([]string{"component"}, labels...), nil)
}

// countersCollector exports the counters of Metrics' Connections,
// summed per component (several Connections may share one).
type countersCollector Metrics

func (cc *countersCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSessionsStarted, descSessionsExpired, descHeartbeatFailures, descTxAttempts,
		descTxRetries, descWorkEvents, descWorkConflicts, descWorkNothing, descWorkPaused, descWorkCapped, descWorkAsked,
		descClaimsStale, descBackoffs, descClaimsTakenOver, descProcessPaused, descProcessCap} {
		ch <- d
	}
}

func (cc *countersCollector) Collect(ch chan<- prometheus.Metric) {
	type key struct {
		d      *prometheus.Desc
		labels [3]string
	}
	sums := map[key]int64{}
	var order []key
	add := func(d *prometheus.Desc, v int64, labels ...string) {
		k := key{d: d}
		copy(k.labels[:], labels)
		if _, ok := sums[k]; !ok {
			order = append(order, k)
		}
		if d == descProcessPaused || d == descProcessCap {
			sums[k] = max(sums[k], v)
			return
		}
		sums[k] += v
	}
	m := (*Metrics)(cc)
	m.mu.Lock()
	conns := append([]*metricSource(nil), m.conns...)
	m.mu.Unlock()
	for _, src := range conns {
		c, comp := src.c, src.component
		add(descSessionsStarted, c.SessionsStarted.Load(), comp)
		add(descSessionsExpired, c.SessionsExpired.Load(), comp)
		add(descHeartbeatFailures, c.HeartbeatFailures.Load(), comp)
		add(descTxAttempts, c.Attempts.Load(), comp)
		for r := range counters.RetryReasons {
			add(descTxRetries, c.Retries[r].Load(), comp, r.String())
		}
		c.EachProcess(func(process string, p *counters.Process) {
			for i, e := range counters.HistoryEvents {
				if n := p.Events[i].Load(); n > 0 {
					add(descWorkEvents, n, comp, process, string(e))
				}
			}
			add(descWorkConflicts, p.Conflicts.Load(), comp, process)
			add(descWorkNothing, p.Nothing.Load(), comp, process)
			add(descWorkPaused, p.Paused.Load(), comp, process)
			add(descWorkCapped, p.Capped.Load(), comp, process)
			add(descWorkAsked, p.Asked.Load(), comp, process)
			add(descClaimsStale, p.Stale.Load(), comp, process)
			add(descBackoffs, p.Backoffs.Load(), comp, process)
			add(descClaimsTakenOver, p.TakenOver.Load(), comp, process)
			if p.ControlsSeen.Load() {
				add(descProcessPaused, p.PausedNow.Load(), comp, process)
				add(descProcessCap, p.CapNow.Load(), comp, process)
			}
		})
	}
	for _, k := range order {
		n, kind := 1, prometheus.CounterValue
		switch k.d {
		case descTxRetries, descWorkConflicts, descWorkNothing, descWorkPaused, descWorkCapped, descWorkAsked, descClaimsStale, descBackoffs, descClaimsTakenOver:
			n = 2
		case descProcessPaused, descProcessCap:
			n, kind = 2, prometheus.GaugeValue
		case descWorkEvents:
			n = 3
		}
		ch <- prometheus.MustNewConstMetric(k.d, kind, float64(sums[k]), k.labels[:n]...)
	}
}
