package tracing

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// The zero Tracer is off: its spans do nothing and cost no allocation.
func TestOffAllocatesNothing(t *testing.T) {
	var off Tracer
	if off.On() || New(nil).On() {
		t.Fatal("a Tracer without a provider is on")
	}
	ctx := context.Background()
	err := errors.New("boom")
	allocs := testing.AllocsPerRun(100, func() {
		c, span := off.Start(ctx, "x")
		if c != ctx || span.Recording() || span.SpanContext().IsValid() {
			t.Fatal("an off Tracer started a span")
		}
		c, span = off.StartRoot(c, "y", nil)
		span.Link(trace.SpanContext{})
		_ = off.ContextWithParent(c, ctx)
		span.End("ok", err)
	})
	if allocs != 0 {
		t.Errorf("off: %v allocations per run, want 0", allocs)
	}
}

// A Tracer of a provider starts spans under ScopeName: Start a child of
// ctx's span, StartRoot a root linked to the valid span contexts it is
// given, ContextWithParent moves a span to another context, and End
// records the outcome and the error.
func TestSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tr := New(tp)
	if !tr.On() {
		t.Fatal("off with a provider")
	}
	ctx, parent := tr.Start(context.Background(), "parent")
	_, child := tr.Start(ctx, "child")
	child.End("ok", nil)
	_, root := tr.StartRoot(ctx, "root", []trace.SpanContext{parent.SpanContext(), {}})
	root.Link(child.SpanContext())
	root.End("error", errors.New("boom"))
	moved, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, adopted := tr.Start(tr.ContextWithParent(moved, ctx), "adopted")
	adopted.End("ok", nil)
	parent.End("ok", nil)

	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byName[s.Name()] = s
		if s.InstrumentationScope().Name != ScopeName {
			t.Errorf("%s: scope %q", s.Name(), s.InstrumentationScope().Name)
		}
	}
	p := byName["parent"].SpanContext()
	if byName["child"].Parent().SpanID() != p.SpanID() || byName["adopted"].Parent().SpanID() != p.SpanID() {
		t.Error("child or adopted span is not the parent's child")
	}
	r := byName["root"]
	if r.Parent().IsValid() || r.SpanContext().TraceID() == p.TraceID() {
		t.Error("the root span is in its parent's trace")
	}
	if len(r.Links()) != 2 || !r.Links()[0].SpanContext.Equal(p) || !r.Links()[1].SpanContext.Equal(byName["child"].SpanContext()) {
		t.Errorf("root's links = %v", r.Links())
	}
	if r.Status().Code != codes.Error || r.Status().Description != "boom" {
		t.Errorf("root's status = %v", r.Status())
	}
	for name, want := range map[string]string{"root": "error", "child": "ok"} {
		found := false
		for _, kv := range byName[name].Attributes() {
			if kv.Key == Outcome && kv.Value.AsString() == want {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: no outcome %q in %v", name, want, byName[name].Attributes())
		}
	}
	if byName["child"].Status().Code != codes.Unset {
		t.Errorf("child's status = %v", byName["child"].Status())
	}
}
