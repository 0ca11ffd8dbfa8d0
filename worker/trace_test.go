package worker

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/internal/testing/testdb"
	"github.com/bmdb-dev/bmdb/internal/tracing"
)

// A traced Loop: each machine's worker.handle span is a child of the
// loop's context's span, carries the claim's identity and outcome (a
// failed Work recorded as an error), links to the batch span that claimed
// it, and is the Handler's context's span and the parent of the claim's
// end; each worker.claim span is the parent of its WorkMany.
func TestLoopSpans(t *testing.T) {
	const machines = 6
	e := newEnv(t, machines)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	conn, err := bmdb.Open(context.Background(), bmdb.Config{
		DSN: e.dsn, ComponentName: "worker-trace", SessionInterval: envInterval,
		WrapConnector: testdb.WrapConnector(), TracerProvider: tp,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })

	var bad uuid.UUID
	if err := e.db.QueryRow("SELECT min(machine_id::TEXT)::UUID FROM machines").Scan(&bad); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	handlerSpans := map[uuid.UUID]trace.SpanContext{} // each machine's Handler's context's span
	retrieveDone := func(ctx context.Context, tx *bmdb.Tx, limit int32) ([]uuid.UUID, error) {
		ids, err := retrieveNotDone(ctx, tx, limit)
		// The failed machine, in backoff, is not a candidate again.
		for i, id := range ids {
			if id == bad {
				var failed int
				if err := tx.DBTX().QueryRowContext(ctx, "SELECT count(*) FROM work_history WHERE machine_id = $1 AND event = 'Failed'", bad).Scan(&failed); err != nil {
					return nil, err
				}
				if failed > 0 {
					ids = append(ids[:i:i], ids[i+1:]...)
				}
				break
			}
		}
		return ids, err
	}
	l, err := New(conn, Config{
		Process: process, Retrieve: retrieveDone, Concurrency: 2, PollMin: 10 * time.Millisecond, PollMax: 50 * time.Millisecond,
		Work: func(ctx context.Context, w *bmdb.Work) (func(*bmdb.Tx) error, error) {
			mu.Lock()
			handlerSpans[w.Machine()] = trace.SpanContextFromContext(ctx)
			mu.Unlock()
			if w.Machine() == bad {
				return nil, errors.New("burn-in failed")
			}
			return markDone(w), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, loopSpan := tp.Tracer("test").Start(context.Background(), "loop")
	ctx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- l.Run(ctx) }()
	eventually(t, 30*time.Second, "every machine done or failed", func() bool {
		return e.count("SELECT count(*) FROM done") == machines-1 &&
			e.count("SELECT count(*) FROM work_history WHERE event = 'Failed'") == 1
	})
	cancel()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	loopSpan.End()

	spans := rec.Ended()
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byID[s.SpanContext().SpanID()] = s
	}
	str := func(s sdktrace.ReadOnlySpan, key attribute.Key) string {
		for _, kv := range s.Attributes() {
			if kv.Key == key {
				return kv.Value.String()
			}
		}
		return ""
	}
	handled := map[string]bool{}
	claimSpans, workManyUnderClaim := 0, 0
	for _, s := range spans {
		switch s.Name() {
		case "worker.claim":
			claimSpans++
			if s.Parent().SpanID() != loopSpan.SpanContext().SpanID() {
				t.Errorf("worker.claim's parent is not the loop's span")
			}
			if str(s, tracing.Process) != process {
				t.Errorf("worker.claim: process %q", str(s, tracing.Process))
			}
		case "bmdb.WorkMany":
			if p, ok := byID[s.Parent().SpanID()]; ok && p.Name() == "worker.claim" {
				workManyUnderClaim++
			}
		case "bmdb.Finish", "bmdb.FinishAndWork", "bmdb.Fail":
			if p, ok := byID[s.Parent().SpanID()]; !ok || p.Name() != "worker.handle" {
				t.Errorf("%s is not a child of a worker.handle span", s.Name())
			} else if str(p, tracing.ClaimID) != str(s, tracing.ClaimID) {
				t.Errorf("%s ends claim %s under the handle span of claim %s", s.Name(), str(s, tracing.ClaimID), str(p, tracing.ClaimID))
			}
		case "worker.handle":
			m := uuid.MustParse(str(s, tracing.Machine))
			handled[m.String()] = true
			if s.Parent().SpanID() != loopSpan.SpanContext().SpanID() {
				t.Errorf("worker.handle of %s: parent is not the loop's span", m)
			}
			mu.Lock()
			hs := handlerSpans[m]
			mu.Unlock()
			if !hs.Equal(s.SpanContext()) {
				t.Errorf("worker.handle of %s is not the Handler's context's span", m)
			}
			var claimID string
			if err := e.db.QueryRow("SELECT claim_id::TEXT FROM work_history WHERE machine_id = $1 AND event = 'Started'", m).Scan(&claimID); err != nil {
				t.Fatal(err)
			}
			if got := str(s, tracing.ClaimID); got != claimID {
				t.Errorf("worker.handle of %s: claim id %s, history says %s", m, got, claimID)
			}
			if str(s, tracing.FencingToken) == "" {
				t.Errorf("worker.handle of %s: no fencing token", m)
			}
			linked := false
			for _, link := range s.Links() {
				if b, ok := byID[link.SpanContext.SpanID()]; ok && b.Name() == "bmdb.batch" {
					linked = true
				}
			}
			if !linked {
				t.Errorf("worker.handle of %s links to no batch span: %v", m, s.Links())
			}
			want, status := "finished", codes.Unset
			if m == bad {
				want, status = "failed", codes.Error
			}
			if got := str(s, tracing.Outcome); got != want || s.Status().Code != status {
				t.Errorf("worker.handle of %s: outcome %q, status %v; want %q, %v", m, got, s.Status(), want, status)
			}
		}
	}
	if len(handled) != machines {
		t.Errorf("%d machines have a worker.handle span, want %d", len(handled), machines)
	}
	if claimSpans == 0 || workManyUnderClaim == 0 {
		t.Errorf("%d worker.claim spans, %d WorkMany spans under one; want some", claimSpans, workManyUnderClaim)
	}
}
