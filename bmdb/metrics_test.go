package bmdb

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// scrape returns the value lines of a /metrics page that start with prefix.
func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(body)
}

// The metrics a scrape shows move with what the connection does.
func TestMetricsScrape(t *testing.T) {
	e := newWorkEnv(t)
	reg := prometheus.NewRegistry()
	metrics, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewMetrics(reg); err == nil {
		t.Error("registering twice on one registry succeeded")
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	c := e.open(func(c *Config) { c.Metrics = metrics })
	s1, s2 := e.session(c), e.session(c)
	m1, m2 := e.machine(), e.machine()
	ctx := context.Background()
	w, err := s1.Work(ctx, "install", retrieveAll(m1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Work(ctx, "install", retrieveAll(m1)); !errors.Is(err, ErrWorkConflict) {
		t.Fatalf("conflict: %v", err)
	}
	if err := w.Finish(ctx, tagCommit(m1)); err != nil {
		t.Fatal(err)
	}
	w, _ = s1.Work(ctx, "install", retrieveAll(m2))
	if err := w.Fail(ctx, &testBackoff, "broken"); err != nil {
		t.Fatal(err)
	}
	if err := s1.ClearBackoff(ctx, m2, "install", "operator"); err != nil {
		t.Fatal(err)
	}
	if _, err := s1.Work(ctx, "install", retrieveAll(m2)); err != nil {
		t.Fatal(err)
	}
	e.expireInDB(s1.ID(), time.Millisecond)
	if _, err := s2.Work(ctx, "install", retrieveAll(m2)); err != nil { // takes over
		t.Fatal(err)
	}
	waitDone(t, s1, 3*testInterval)
	eventually(t, 3*testInterval, "a heartbeat", func() bool {
		return strings.Contains(scrape(t, srv.URL), `bmdb_heartbeat_duration_seconds_count{component="test"}`)
	})

	page := scrape(t, srv.URL)
	for _, want := range []string{
		`bmdb_sessions_started_total{component="test"} 2`,
		`bmdb_sessions_expired_total{component="test"} 1`,
		`bmdb_work_events_total{component="test",event="Started",process="install"} 4`,
		`bmdb_work_events_total{component="test",event="Finished",process="install"} 1`,
		`bmdb_work_events_total{component="test",event="Failed",process="install"} 1`,
		`bmdb_work_events_total{component="test",event="Abandoned",process="install"} 1`,
		`bmdb_work_events_total{component="test",event="BackoffCleared",process="install"} 1`,
		`bmdb_work_conflicts_total{component="test",process="install"} 1`,
		`bmdb_work_asked_total{component="test",process="install"} 5`,
		`bmdb_backoffs_total{component="test",process="install"} 1`,
		`bmdb_claims_taken_over_total{component="test",process="install"} 1`,
		`bmdb_claim_duration_seconds_count{component="test",process="install"} 4`,
	} {
		if !strings.Contains(page, want+"\n") {
			t.Errorf("scrape lacks %s", want)
		}
	}
	if !strings.Contains(page, `bmdb_transaction_attempts_total{component="test"}`) {
		t.Error("scrape lacks transaction attempts")
	}
	if t.Failed() {
		t.Log(page)
	}
}
