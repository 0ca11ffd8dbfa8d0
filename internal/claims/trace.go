package claims

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/trace"

	"github.com/bmdb-dev/bmdb/internal/lease"
	"github.com/bmdb-dev/bmdb/internal/tracing"
	"github.com/bmdb-dev/bmdb/internal/txn"
)

// Batch is what a call learns of the batch transaction that carried it,
// for its span: the batch's span (invalid when tracing is off) and its
// attempts. Set with the call's outcome.
type Batch struct {
	Span     trace.SpanContext
	Attempts int
}

// Outcome names err, a call's or a batch's outcome, for the bmdb.outcome
// attribute of its span, and returns the error to record on the span: nil
// when the outcome is not a failure (committed; nothing to do, paused,
// capped, conflict: the claim found no machine it could take).
func Outcome(err error) (string, error) {
	switch {
	case err == nil:
		return "ok", nil
	case errors.Is(err, ErrProcessPaused):
		return "paused", nil
	case errors.Is(err, ErrCapReached):
		return "capped", nil
	case errors.Is(err, ErrNothingToDo):
		return "nothing_to_do", nil
	case errors.Is(err, ErrWorkConflict):
		return "conflict", nil
	case errors.Is(err, ErrWorkLost):
		return "lost", err
	case errors.Is(err, ErrUnknownMachine):
		return "unknown_machine", err
	case errors.Is(err, lease.ErrSessionExpired):
		return "session_expired", err
	case errors.Is(err, lease.ErrSessionClosed):
		return "session_closed", err
	case errors.Is(err, txn.ErrRetriesExhausted):
		return "retries_exhausted", err
	case errors.Is(err, txn.ErrAmbiguousCommit):
		return "ambiguous_commit", err
	case errors.Is(err, txn.ErrTransactionTooLong):
		return "transaction_too_long", err
	case errors.Is(err, context.Canceled):
		return "canceled", err
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded", err
	}
	return "error", err
}

// startBatch starts the span of a batch of reqs, a trace of its own
// linked to the span of each call (the calls join it later are linked as
// they join: linkJoined). Off, it returns ctx and a Span that does
// nothing, without allocating.
func (q *queue) startBatch(ctx context.Context, reqs []*request) (context.Context, tracing.Span) {
	t := q.e.cfg.Tracer
	if !t.On() {
		return ctx, tracing.Span{}
	}
	links := make([]trace.SpanContext, len(reqs))
	for i, r := range reqs {
		links[i] = trace.SpanContextFromContext(r.ctx)
	}
	ctx, span := t.StartRoot(ctx, "bmdb.batch", links)
	if span.Recording() {
		span.SetAttributes(tracing.Process.String(q.process), tracing.Component.String(q.e.cfg.ComponentName))
	}
	return ctx, span
}

// linkJoined links span, a batch's, to the calls of reqs from the n-th
// on, which joined it at the start of an attempt.
func linkJoined(span tracing.Span, reqs []*request, n int) {
	if !span.Recording() {
		return
	}
	for _, r := range reqs[n:] {
		span.Link(trace.SpanContextFromContext(r.ctx))
	}
}

// endBatch ends span, the span of a batch of reqs whose transaction ran
// attempts times and returned err.
func endBatch(span tracing.Span, reqs []*request, attempts int, err error) {
	if !span.Recording() {
		span.End("", nil)
		return
	}
	claims, ends := split(reqs)
	span.SetAttributes(tracing.BatchSize.Int(len(reqs)), tracing.BatchClaims.Int(len(claims)),
		tracing.BatchEnds.Int(len(ends)), tracing.Attempts.Int(attempts))
	outcome, failed := Outcome(err)
	span.End(outcome, failed)
}
