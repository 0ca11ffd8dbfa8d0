package bmdb

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/bmdb-dev/bmdb/internal/claims"
	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/tracing"
)

// traced returns a Config modifier that sends the Connection's spans to a
// recorder, and the recorder.
func traced(t *testing.T) (func(*Config), *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return func(c *Config) { c.TracerProvider = tp }, rec
}

// spansNamed returns the ended spans of rec named name.
func spansNamed(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// onlySpan returns the one ended span of rec named name, failing the test
// if there is not exactly one.
func onlySpan(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	spans := spansNamed(rec, name)
	if len(spans) != 1 {
		t.Fatalf("%d spans named %s, want 1 (all: %v)", len(spans), name, spanNames(rec))
	}
	return spans[0]
}

// spanNames lists the names of rec's ended spans.
func spanNames(rec *tracetest.SpanRecorder) []string {
	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
	}
	return names
}

// attr returns span's attribute key, and whether it has it.
func attr(span sdktrace.ReadOnlySpan, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range span.Attributes() {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// wantAttr fails the test unless span has key with value want (a string,
// int or int64).
func wantAttr(t *testing.T, span sdktrace.ReadOnlySpan, key attribute.Key, want any) {
	t.Helper()
	v, ok := attr(span, key)
	if !ok {
		t.Errorf("span %s has no %s (attributes %v)", span.Name(), key, span.Attributes())
		return
	}
	var got any
	switch want.(type) {
	case string:
		got = v.AsString()
	case int:
		got = int(v.AsInt64())
	case int64:
		got = v.AsInt64()
	}
	if got != want {
		t.Errorf("span %s: %s = %v, want %v", span.Name(), key, got, want)
	}
}

// linkedTo reports whether span links to the span of sc.
func linkedTo(span sdktrace.ReadOnlySpan, sc trace.SpanContext) bool {
	for _, l := range span.Links() {
		if l.SpanContext.SpanID() == sc.SpanID() && l.SpanContext.TraceID() == sc.TraceID() {
			return true
		}
	}
	return false
}

// batchOf returns the batch span that span links to, failing the test if
// there is none.
func batchOf(t *testing.T, rec *tracetest.SpanRecorder, span sdktrace.ReadOnlySpan) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, b := range spansNamed(rec, "bmdb.batch") {
		if linkedTo(span, b.SpanContext()) {
			return b
		}
	}
	t.Fatalf("span %s links to no bmdb.batch span (links %v)", span.Name(), span.Links())
	return nil
}

// Work, Finish and Transact make their spans, with the claim's identity
// (the Work's own), the batch's attempts and the outcome, each linked to
// the batch span that carried it, which links back and says its size.
func TestTraceWorkFinishTransact(t *testing.T) {
	e := newWorkEnv(t)
	withTracing, rec := traced(t)
	s := e.session(e.open(withTracing))
	m := e.machine()
	ctx := context.Background()

	w, err := s.Work(ctx, "install", retrieveAll(m))
	if err != nil {
		t.Fatalf("Work: %v", err)
	}
	if err := w.Finish(ctx, tagCommit(m)); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	if err := s.Transact(ctx, func(*Tx) error { return nil }); err != nil {
		t.Fatalf("Transact: %v", err)
	}

	for _, name := range []string{"bmdb.Work", "bmdb.Finish"} {
		span := onlySpan(t, rec, name)
		wantAttr(t, span, tracing.Process, "install")
		wantAttr(t, span, tracing.Machine, m.String())
		wantAttr(t, span, tracing.ClaimID, w.ClaimID().String())
		wantAttr(t, span, tracing.FencingToken, w.FencingToken())
		wantAttr(t, span, tracing.Outcome, "ok")
		if span.Status().Code == codes.Error {
			t.Errorf("span %s: status %v", name, span.Status())
		}
		if v, ok := attr(span, tracing.Attempts); !ok || v.AsInt64() < 1 {
			t.Errorf("span %s: attempts %v", name, v.AsInt64())
		}
		batch := batchOf(t, rec, span)
		if !linkedTo(batch, span.SpanContext()) {
			t.Errorf("the batch of %s does not link back to it", name)
		}
		if batch.Parent().IsValid() {
			t.Errorf("the batch of %s has a parent: it should start a trace of its own", name)
		}
		wantAttr(t, batch, tracing.Process, "install")
		wantAttr(t, batch, tracing.Outcome, "ok")
		for _, key := range []attribute.Key{tracing.BatchSize, tracing.Attempts} {
			if v, ok := attr(batch, key); !ok || v.AsInt64() < 1 {
				t.Errorf("batch of %s: %s = %v, want >= 1", name, key, v.AsInt64())
			}
		}
		if name == "bmdb.Work" && !batch.SpanContext().Equal(w.BatchSpanContext()) {
			t.Errorf("Work.BatchSpanContext = %v, the batch span is %v", w.BatchSpanContext(), batch.SpanContext())
		}
	}
	tx := onlySpan(t, rec, "bmdb.Transact")
	wantAttr(t, tx, tracing.Outcome, "ok")
	if v, ok := attr(tx, tracing.Attempts); !ok || v.AsInt64() < 1 {
		t.Errorf("Transact: attempts %v", v.AsInt64())
	}
}

// A call that fails records it: a lost claim's Finish has the outcome
// lost and an error status; a Work that finds its candidates claimed has
// the outcome conflict, which is not an error; the batch of a Transact
// whose fn fails records fn's error.
func TestTraceFailures(t *testing.T) {
	e := newWorkEnv(t)
	withTracing, rec := traced(t)
	c := e.open(withTracing)
	s, other := e.session(c), e.session(c)
	m := e.machine()
	w, err := s.Work(context.Background(), "install", retrieveAll(m))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Work(context.Background(), "install", retrieveAll(m)); !errors.Is(err, ErrWorkConflict) {
		t.Fatalf("Work of a claimed machine = %v, want ErrWorkConflict", err)
	}
	e.exec("DELETE FROM work WHERE machine_id = $1", m)
	if err := w.Cancel(context.Background()); !errors.Is(err, ErrWorkLost) {
		t.Fatalf("Cancel of a lost claim = %v, want ErrWorkLost", err)
	}
	boom := errors.New("boom")
	if err := s.Transact(context.Background(), func(*Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Transact = %v", err)
	}

	works := spansNamed(rec, "bmdb.Work")
	if len(works) != 2 {
		t.Fatalf("%d Work spans, want 2", len(works))
	}
	conflict := works[1]
	wantAttr(t, conflict, tracing.Outcome, "conflict")
	wantAttr(t, conflict, tracing.Claimed, 0)
	if conflict.Status().Code == codes.Error {
		t.Errorf("a conflict is an outcome, not an error: status %v", conflict.Status())
	}

	cancel := onlySpan(t, rec, "bmdb.Cancel")
	wantAttr(t, cancel, tracing.Outcome, "lost")
	wantAttr(t, cancel, tracing.ClaimID, w.ClaimID().String())
	wantAttr(t, cancel, tracing.Event, string(store.WorkHistoryEventCanceled))
	if cancel.Status().Code != codes.Error {
		t.Errorf("lost Cancel: status %v, want Error", cancel.Status())
	}
	if !hasException(cancel) {
		t.Errorf("lost Cancel records no error event: %v", cancel.Events())
	}
	batchOf(t, rec, cancel)

	tx := onlySpan(t, rec, "bmdb.Transact")
	wantAttr(t, tx, tracing.Outcome, "error")
	if tx.Status().Code != codes.Error || tx.Status().Description != "boom" {
		t.Errorf("failed Transact: status %v", tx.Status())
	}
}

// hasException reports whether span recorded an error (RecordError's
// event).
func hasException(span sdktrace.ReadOnlySpan) bool {
	for _, ev := range span.Events() {
		if ev.Name == "exception" {
			return true
		}
	}
	return false
}

// A batch that carries several calls links to each, and each to it; a
// WorkMany span lists its claims as events.
func TestTraceBatchOfSeveralCalls(t *testing.T) {
	e := newWorkEnv(t)
	withTracing, rec := traced(t)
	s := e.session(e.open(withTracing))
	ms := []uuid.UUID{e.machine(), e.machine(), e.machine()}
	works, err := s.WorkMany(context.Background(), "install", 3, retrieveAll(ms...))
	if err != nil || len(works) != 3 {
		t.Fatalf("WorkMany: %d, %v", len(works), err)
	}
	many := onlySpan(t, rec, "bmdb.WorkMany")
	wantAttr(t, many, tracing.Claimed, 3)
	wantAttr(t, many, tracing.Limit, 3)
	if n := len(many.Events()); n != 3 {
		t.Errorf("WorkMany span has %d events, want one per claim", n)
	}
	// Three Cancels at once: whatever batches carry them, each links to
	// its batch, and the batches' sizes add up to the calls.
	errs := make(chan error, len(works))
	for _, w := range works {
		go func() { errs <- w.Cancel(context.Background()) }()
	}
	for range works {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	cancels := spansNamed(rec, "bmdb.Cancel")
	if len(cancels) != 3 {
		t.Fatalf("%d Cancel spans", len(cancels))
	}
	batches := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, c := range cancels {
		b := batchOf(t, rec, c)
		if !linkedTo(b, c.SpanContext()) {
			t.Errorf("batch does not link back to its Cancel")
		}
		batches[b.SpanContext().SpanID()] = b
	}
	size := int64(0)
	for _, b := range batches {
		v, _ := attr(b, tracing.BatchSize)
		size += v.AsInt64()
	}
	if size != 3 {
		t.Errorf("the Cancels' batches have %d calls in all, want 3", size)
	}
}

// Without a TracerProvider nothing is traced, not even through the global
// provider, and Work.BatchSpanContext is invalid.
func TestTraceOffWithoutProvider(t *testing.T) {
	e := newWorkEnv(t)
	rec := tracetest.NewSpanRecorder()
	global := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(global) })
	c := e.open()
	if c.TracerProvider() != nil {
		t.Fatal("TracerProvider is set by default")
	}
	s := e.session(c)
	m := e.machine()
	w, err := s.Work(context.Background(), "install", retrieveAll(m))
	if err != nil {
		t.Fatal(err)
	}
	if w.BatchSpanContext().IsValid() {
		t.Error("BatchSpanContext is valid without tracing")
	}
	if err := w.Finish(context.Background(), noCommit); err != nil {
		t.Fatal(err)
	}
	if n := len(rec.Ended()) + len(rec.Started()); n != 0 {
		t.Errorf("%d spans recorded without a provider", n)
	}
}

// The untraced path allocates nothing for tracing: starting and ending
// every kind of span with the Connection's tracer off.
func TestTraceOffAllocatesNothing(t *testing.T) {
	var off tracing.Tracer
	w := &Work{process: "install", claim: claims.Claim{Machine: uuid.New(), ID: uuid.New(), Token: 7}}
	end := &claims.EndCall{Event: store.WorkHistoryEventFinished, Claim: w.claim}
	next := &claims.ClaimCall{Limit: 1}
	ctx := context.Background()
	err := ErrWorkLost
	spans := func(tr tracing.Tracer) float64 {
		return testing.AllocsPerRun(100, func() {
			_, span := tr.Start(ctx, "bmdb.Work")
			endWorkMany(span, "install", 1, next, err)
			_, span = tr.Start(ctx, endSpanName(end, next))
			w.endEnd(span, end, next, err)
			_, span = tr.Start(ctx, "bmdb.Transact")
			endTransact(span, 1, err)
		})
	}
	if allocs := spans(off); allocs != 0 {
		t.Errorf("the untraced spans allocate %v times per call, want 0", allocs)
	}
	// The measure sees the traced path's allocations.
	withTracing, _ := traced(t)
	var cfg Config
	withTracing(&cfg)
	if allocs := spans(tracing.New(cfg.TracerProvider)); allocs == 0 {
		t.Error("the traced spans allocate nothing: the measure is broken")
	}
}
