package bmdb

import (
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/bmdb-dev/bmdb/internal/claims"
	"github.com/bmdb-dev/bmdb/internal/store"
	"github.com/bmdb-dev/bmdb/internal/tracing"
)

// TracerProvider returns Config.TracerProvider: where the connection's
// spans go, nil if nowhere. worker.Loop starts its spans with it.
func (c *Connection) TracerProvider() trace.TracerProvider { return c.cfg.TracerProvider }

// BatchSpanContext returns the span context of the batch transaction that
// claimed the Work (see "Tracing" in the package doc): a span that works
// on the machine links to it, as worker.Loop's handle span does. It is
// invalid (the zero value) when the Connection has no TracerProvider.
func (w *Work) BatchSpanContext() trace.SpanContext { return w.batch }

// outcome names err, a call's outcome, for its span's bmdb.outcome, and
// returns the error the span records (nil: not a failure).
func outcome(err error) (string, error) {
	switch {
	case errors.Is(err, ErrWorkDone):
		return "work_done", err
	case errors.Is(err, ErrInvalidArgument):
		return "invalid_argument", err
	}
	return claims.Outcome(err)
}

// endCall ends span, the span of a call that batch carried (a zero batch:
// none did) and that returned err: it links the span to the batch's and
// records the batch's attempts and the outcome.
func endCall(span tracing.Span, batch claims.Batch, err error) {
	if !span.Recording() {
		span.End("", nil)
		return
	}
	span.Link(batch.Span)
	if batch.Attempts > 0 {
		span.SetAttributes(tracing.Attempts.Int(batch.Attempts))
	}
	o, failed := outcome(err)
	span.End(o, failed)
}

// claimKV are the attributes of claim c (a Work's, or an end's).
func claimKV(c claims.Claim) []attribute.KeyValue {
	return []attribute.KeyValue{
		tracing.Machine.String(c.Machine.String()), tracing.ClaimID.String(c.ID.String()), tracing.FencingToken.Int64(c.Token),
	}
}

// endWorkMany ends span, the span of a Work or WorkMany call for process
// that claim made (nil: none, the arguments were refused) and that
// returned err: the claims made are its attributes if there is one, and
// each an event "bmdb.claim".
func endWorkMany(span tracing.Span, process string, limit int, claim *claims.ClaimCall, err error) {
	if !span.Recording() {
		span.End("", nil)
		return
	}
	span.SetAttributes(tracing.Process.String(process), tracing.Limit.Int(limit))
	var batch claims.Batch
	if claim != nil {
		batch = claim.Batch
		recordClaims(span, claim.Claims)
	}
	endCall(span, batch, err)
}

// recordClaims sets the attributes of cs, the claims a call made, on
// span: bmdb.claimed, a "bmdb.claim" event for each, and the claim's
// machine, claim id and fencing token if there is one. span is recording.
func recordClaims(span tracing.Span, cs []claims.Claim) {
	span.SetAttributes(tracing.Claimed.Int(len(cs)))
	for _, c := range cs {
		span.AddEvent("bmdb.claim", claimKV(c)...)
	}
	if len(cs) == 1 {
		span.SetAttributes(claimKV(cs[0])...)
	}
}

// endSpanName is the span name of an end as event, or of a FinishAndWork.
func endSpanName(e *claims.EndCall, next *claims.ClaimCall) string {
	switch {
	case next != nil:
		return "bmdb.FinishAndWork"
	case e.Event == store.WorkHistoryEventFinished:
		return "bmdb.Finish"
	case e.Event == store.WorkHistoryEventCanceled:
		return "bmdb.Cancel"
	}
	return "bmdb.Fail"
}

// endEnd ends span, the span of w's end e (with next, a FinishAndWork's
// claim, or nil) that returned err.
func (w *Work) endEnd(span tracing.Span, e *claims.EndCall, next *claims.ClaimCall, err error) {
	if !span.Recording() {
		span.End("", nil)
		return
	}
	span.SetAttributes(tracing.Process.String(w.process), tracing.Event.String(string(e.Event)))
	span.SetAttributes(claimKV(w.claim)...)
	if next != nil && err == nil {
		for _, c := range next.Claims {
			span.AddEvent("bmdb.claim", claimKV(c)...)
		}
		o, _ := outcome(next.Err)
		if next.Err == nil && len(next.Claims) == 0 {
			o, _ = outcome(ErrNothingToDo)
		}
		span.SetAttributes(tracing.Claimed.Int(len(next.Claims)), tracing.ClaimOutcome.String(o))
	}
	endCall(span, e.Batch, err)
}

// endTransact ends span, the span of a Transact that began attempts
// attempts and returned err.
func endTransact(span tracing.Span, attempts int, err error) {
	if !span.Recording() {
		span.End("", nil)
		return
	}
	span.SetAttributes(tracing.Attempts.Int(attempts))
	o, failed := outcome(err)
	span.End(o, failed)
}
