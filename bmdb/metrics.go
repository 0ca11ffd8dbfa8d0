package bmdb

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bmdb-dev/bmdb/internal/store"
)

// Metrics are bmdb's Prometheus collectors. Create them once per registry
// with NewMetrics and pass them to every Connection in Config.Metrics; the
// component label tells connections apart. bmdb registers nothing
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
//	bmdb_work_asked_total{process}           machines asked for by Work and WorkBatch (vs Started: claimed)
//	bmdb_claim_duration_seconds{process}     (histogram of successful Work calls)
//	bmdb_backoffs_total{process}
type Metrics struct {
	sessionsStarted   *prometheus.CounterVec
	sessionsExpired   *prometheus.CounterVec
	heartbeatSeconds  *prometheus.HistogramVec
	heartbeatFailures *prometheus.CounterVec
	txAttempts        *prometheus.CounterVec
	txRetries         *prometheus.CounterVec
	workEvents        *prometheus.CounterVec
	workConflicts     *prometheus.CounterVec
	workNothing       *prometheus.CounterVec
	workAsked         *prometheus.CounterVec
	claimSeconds      *prometheus.HistogramVec
	backoffs          *prometheus.CounterVec
}

// NewMetrics creates bmdb's collectors and registers them with reg. It
// fails if reg already has collectors of the same names. A nil reg gives
// metrics that are kept but exported nowhere.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	component := []string{"component"}
	process := []string{"component", "process"}
	latency := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}
	m := &Metrics{
		sessionsStarted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bmdb_sessions_started_total", Help: "Sessions started."}, component),
		sessionsExpired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bmdb_sessions_expired_total", Help: "Sessions that ended by expiry rather than Close."}, component),
		heartbeatSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "bmdb_heartbeat_duration_seconds", Help: "Duration of successful heartbeats.", Buckets: latency}, component),
		heartbeatFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bmdb_heartbeat_failures_total", Help: "Failed heartbeat attempts."}, component),
		txAttempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bmdb_transaction_attempts_total", Help: "Transaction attempts, first tries and retries."}, component),
		txRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bmdb_transaction_retries_total", Help: "Transaction attempts retried, by reason: serialization failure, lock_timeout, deadlock, or connection failure before COMMIT."},
			[]string{"component", "reason"}),
		workEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bmdb_work_events_total", Help: "Committed work history events by process and event."},
			[]string{"component", "process", "event"}),
		workConflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bmdb_work_conflicts_total", Help: "Work calls that found only machines claimed, or being claimed, by other sessions."}, process),
		workNothing: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bmdb_work_nothing_to_do_total", Help: "Work calls that found nothing to claim."}, process),
		workAsked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bmdb_work_asked_total", Help: "Machines asked for by Work and WorkBatch calls (their limits)."}, process),
		claimSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "bmdb_claim_duration_seconds", Help: "Duration of successful Work calls, retries included.", Buckets: latency}, process),
		backoffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bmdb_backoffs_total", Help: "Backoffs set by Fail."}, process),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{
			m.sessionsStarted, m.sessionsExpired, m.heartbeatSeconds, m.heartbeatFailures,
			m.txAttempts, m.txRetries, m.workEvents, m.workConflicts, m.workNothing, m.workAsked, m.claimSeconds, m.backoffs,
		} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("bmdb: registering metrics: %w", err)
			}
		}
	}
	return m, nil
}

// componentMetrics are a Connection's metrics, bound to its component.
type componentMetrics struct {
	m                 *Metrics
	component         string
	sessionsStarted   prometheus.Counter
	sessionsExpired   prometheus.Counter
	heartbeatSeconds  prometheus.Observer
	heartbeatFailures prometheus.Counter
	txAttempts        prometheus.Counter
}

func (m *Metrics) forComponent(component string) *componentMetrics {
	return &componentMetrics{
		m:                 m,
		component:         component,
		sessionsStarted:   m.sessionsStarted.WithLabelValues(component),
		sessionsExpired:   m.sessionsExpired.WithLabelValues(component),
		heartbeatSeconds:  m.heartbeatSeconds.WithLabelValues(component),
		heartbeatFailures: m.heartbeatFailures.WithLabelValues(component),
		txAttempts:        m.txAttempts.WithLabelValues(component),
	}
}

func (cm *componentMetrics) workEvent(process string, event store.WorkHistoryEvent) {
	cm.m.workEvents.WithLabelValues(cm.component, process, string(event)).Inc()
}

func (cm *componentMetrics) workEvents(processes []string, event store.WorkHistoryEvent) {
	for _, p := range processes {
		cm.workEvent(p, event)
	}
}

func (cm *componentMetrics) conflict(process string) {
	cm.m.workConflicts.WithLabelValues(cm.component, process).Inc()
}

func (cm *componentMetrics) nothingToDo(process string) {
	cm.m.workNothing.WithLabelValues(cm.component, process).Inc()
}

func (cm *componentMetrics) asked(process string, n int) {
	cm.m.workAsked.WithLabelValues(cm.component, process).Add(float64(n))
}

func (cm *componentMetrics) claimed(process string, seconds float64) {
	cm.m.claimSeconds.WithLabelValues(cm.component, process).Observe(seconds)
}

func (cm *componentMetrics) backoff(process string) {
	cm.m.backoffs.WithLabelValues(cm.component, process).Inc()
}
