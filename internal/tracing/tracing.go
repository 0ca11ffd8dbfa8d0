// Package tracing is bmdb's use of OpenTelemetry's tracing API: a Tracer
// made from bmdb.Config.TracerProvider that starts nothing at all when no
// provider is set, and a Span whose methods do nothing then, so that the
// untraced path costs a nil check, no allocation. Callers build attributes
// only when Span.Recording says they are kept: a variadic list of
// attributes is allocated by the caller whether or not the span keeps it.
//
// It sits below package claims (the batch spans) and bmdb and worker (the
// calls' and the loop's spans), and uses go.opentelemetry.io/otel's API
// only, never its SDK.
package tracing

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of bmdb's spans, the name its
// Tracer is given.
const ScopeName = "github.com/bmdb-dev/bmdb"

// The attributes of bmdb's spans.
const (
	Process      = attribute.Key("bmdb.process")
	Component    = attribute.Key("bmdb.component")
	Machine      = attribute.Key("bmdb.machine")
	ClaimID      = attribute.Key("bmdb.claim_id")
	FencingToken = attribute.Key("bmdb.fencing_token")
	Attempts     = attribute.Key("bmdb.attempts")
	Outcome      = attribute.Key("bmdb.outcome")
	ClaimOutcome = attribute.Key("bmdb.claim_outcome")
	Limit        = attribute.Key("bmdb.limit")
	Claimed      = attribute.Key("bmdb.claimed")
	Event        = attribute.Key("bmdb.event")
	BatchSize    = attribute.Key("bmdb.batch.size")
	BatchClaims  = attribute.Key("bmdb.batch.claims")
	BatchEnds    = attribute.Key("bmdb.batch.ends")
)

// Tracer starts bmdb's spans. The zero Tracer is off: it starts none.
type Tracer struct {
	t trace.Tracer // nil: off
}

// New returns the Tracer of tp's, or one that is off if tp is nil.
func New(tp trace.TracerProvider) Tracer {
	if tp == nil {
		return Tracer{}
	}
	return Tracer{t: tp.Tracer(ScopeName)}
}

// On reports whether the Tracer starts spans.
func (t Tracer) On() bool { return t.t != nil }

// Start starts a span named name, a child of ctx's span, and returns ctx
// with it. Off, it returns ctx itself and a Span that does nothing.
func (t Tracer) Start(ctx context.Context, name string) (context.Context, Span) {
	if t.t == nil {
		return ctx, Span{}
	}
	ctx, s := t.t.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal))
	return ctx, Span{s: s}
}

// StartRoot starts a span named name that is the root of a trace of its
// own, with ctx's values (its span is not its parent), linked to the
// spans of links that are valid, and returns ctx with it. Off, it returns
// ctx itself and a Span that does nothing. A batch transaction's span is
// one: it carries the calls of many traces.
func (t Tracer) StartRoot(ctx context.Context, name string, links []trace.SpanContext) (context.Context, Span) {
	if t.t == nil {
		return ctx, Span{}
	}
	ls := make([]trace.Link, 0, len(links))
	for _, sc := range links {
		if sc.IsValid() {
			ls = append(ls, trace.Link{SpanContext: sc})
		}
	}
	ctx, s := t.t.Start(ctx, name, trace.WithNewRoot(), trace.WithLinks(ls...), trace.WithSpanKind(trace.SpanKindInternal))
	return ctx, Span{s: s}
}

// Span is one of bmdb's spans, or nothing (the zero Span) when tracing is
// off.
type Span struct {
	s trace.Span // nil: off
}

// Recording reports whether the span keeps what is set on it: build
// attributes only when it does.
func (s Span) Recording() bool { return s.s != nil && s.s.IsRecording() }

// SpanContext returns the span's identity, for links; invalid when off.
func (s Span) SpanContext() trace.SpanContext {
	if s.s == nil {
		return trace.SpanContext{}
	}
	return s.s.SpanContext()
}

// SetAttributes sets kv on the span. Call it only when Recording.
func (s Span) SetAttributes(kv ...attribute.KeyValue) {
	if s.s != nil {
		s.s.SetAttributes(kv...)
	}
}

// AddEvent adds an event named name with kv. Call it only when Recording.
func (s Span) AddEvent(name string, kv ...attribute.KeyValue) {
	if s.s != nil {
		s.s.AddEvent(name, trace.WithAttributes(kv...))
	}
}

// Link links the span to the span of sc, if valid.
func (s Span) Link(sc trace.SpanContext) {
	if s.s != nil && sc.IsValid() {
		s.s.AddLink(trace.Link{SpanContext: sc})
	}
}

// End ends the span with its outcome (bmdb.outcome); err, if not nil,
// is recorded as the span's error (an exception event, and the status
// Error). Pass a nil err for an outcome that is not a failure, such as
// nothing to do.
func (s Span) End(outcome string, err error) {
	if s.s == nil {
		return
	}
	if s.s.IsRecording() {
		s.s.SetAttributes(Outcome.String(outcome))
		if err != nil {
			s.s.RecordError(err)
			s.s.SetStatus(codes.Error, err.Error())
		}
	}
	s.s.End()
}

// ContextWithParent returns ctx with parent's span as its span, for a
// span that is to be a child of parent's span but live under ctx's
// cancellation. Off, it returns ctx itself.
func (t Tracer) ContextWithParent(ctx, parent context.Context) context.Context {
	if t.t == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, trace.SpanFromContext(parent))
}
