// Package oteldedup traces the dedup engine with OpenTelemetry: one span
// per call (each message of a dedup.Deduplicator, a message refused for
// want of a key included; each Engine.Do, so each httpdedup request and
// lambdadedup record that reaches a claim) that tells what the claim
// decided and what the store operations cost. An HTTP request or a Lambda
// record refused before the engine (no Idempotency-Key, a malformed body)
// is logged and counted by Observer but gets no span. It is its own
// package so that the core stays free of OpenTelemetry.
//
//	tracer := oteldedup.New(oteldedup.Config{})            // the global TracerProvider
//	d, err := dedup.New(dedup.Config{Store: store, Key: key, Tracer: tracer})
//	router.AddMiddleware(tracer.Middleware, d.Middleware) // parent spans from traceparent metadata
//
// The span is named "dedup " + the handler name (or "dedup") and covers the
// call: the claim, a wait for another claim (Config.InProgressWait), the
// handler, and Complete or Release. The handler's own spans are its
// children (its context derives from the span's). Its parent is the span
// in the message's context: the one a tracing middleware put there, or the
// one Middleware extracted from the message's metadata (W3C traceparent,
// as producers instrumented with OpenTelemetry and watermill-kafka's
// otelsarama write it).
//
// Attributes (set once the claim has decided):
//
//	dedup.scope           the call's scope
//	dedup.handler         the Watermill handler (or HTTP route)
//	dedup.key             the business key, only with Config.RecordKeys
//	messaging.message.id  the message's UUID
//	messaging.destination.name the topic
//	dedup.outcome         acquired, duplicate, in_progress, conflict, no_key, transport_key or store_error
//	dedup.replayed        true when a duplicate's stored result came back for replay
//	dedup.shadow          true when Config.Shadow ran the handler although the outcome would have skipped or refused it
//	dedup.waited_s        seconds waited for another claim to end, when it waited
//	dedup.store.<op>.duration_s the last claim/complete/release round trip, in seconds
//
// Every decision is a span event ("dedup.claim_won", "dedup.completed",
// "dedup.skip_duplicate", "dedup.would_skip", ...) and so is every store
// operation ("dedup.store.claim" with duration_s and result). The status is
// Error for the decisions the core logs as errors (claim_lost, store_error,
// fail_open, key_missing, transport_key, key_reuse) and when the call returns an error
// other than dedup.ErrInProgress (a copy finding its key in progress is
// normal, not a failure).
package oteldedup

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
)

// instrumentation is the name of the tracer, the instrumentation scope.
const instrumentation = "github.com/watermill-dedup/watermill-dedup/oteldedup"

// Config configures a Tracer. Every field is optional.
type Config struct {
	// TracerProvider makes the tracer. Defaults to otel.GetTracerProvider()
	// (a no-op until the application sets one).
	TracerProvider trace.TracerProvider

	// Propagator reads a message's trace context from its metadata in
	// Middleware. Defaults to propagation.TraceContext{} (W3C traceparent
	// and tracestate), not the global propagator, which is a no-op until
	// the application sets one.
	Propagator propagation.TextMapPropagator

	// RecordKeys adds the business key to every span (dedup.key). Defaults
	// to false: keys can be personal data (an e-mail, an account number)
	// and an HTTP scope holds the caller's identity, so neither goes to
	// the tracing backend unless asked; the scope always does.
	RecordKeys bool
}

// Tracer implements dedup.Tracer with OpenTelemetry spans. Create it with
// New; it is safe for concurrent use. Cost per call: one span, an event per
// decision and store operation, a few attributes; with a sampler that
// drops the trace, the span is a no-op.
type Tracer struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	recordKeys bool
}

var _ dedup.Tracer = (*Tracer)(nil)

// New returns a Tracer; nothing in Config can be wrong.
func New(config Config) *Tracer {
	if config.TracerProvider == nil {
		config.TracerProvider = otel.GetTracerProvider()
	}
	if config.Propagator == nil {
		config.Propagator = propagation.TraceContext{}
	}
	return &Tracer{
		tracer:     config.TracerProvider.Tracer(instrumentation),
		propagator: config.Propagator,
		recordKeys: config.RecordKeys,
	}
}

// Middleware is a Watermill middleware that gives the message's context
// the trace context its metadata carries (Config.Propagator; W3C
// traceparent by default), so that the dedup span, added by the
// Deduplicator inside it, has the producer's span as its parent. A message
// whose context already carries a span (a tracing middleware ran first, or
// GoChannel kept the publisher's context) keeps it; one without trace
// metadata goes on unchanged, and its dedup span starts a new trace. Add it
// before the Deduplicator: router.AddMiddleware(tracer.Middleware,
// d.Middleware).
func (t *Tracer) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		if !trace.SpanContextFromContext(ctx).IsValid() {
			if parent := t.propagator.Extract(ctx, propagation.MapCarrier(msg.Metadata)); trace.SpanContextFromContext(parent).IsValid() {
				msg.SetContext(parent)
				defer msg.SetContext(ctx)
			}
		}
		return h(msg)
	}
}

// StartCall starts the call's span as a child of the span in ctx, and
// returns the context carrying it.
func (t *Tracer) StartCall(ctx context.Context, call dedup.Call) (context.Context, dedup.CallTrace) {
	name := "dedup"
	if call.Handler != "" {
		name += " " + call.Handler
	}
	attrs := []attribute.KeyValue{attribute.String("dedup.scope", call.Scope)}
	if call.Handler != "" {
		attrs = append(attrs, attribute.String("dedup.handler", call.Handler))
	}
	if call.Topic != "" {
		attrs = append(attrs, attribute.String("messaging.destination.name", call.Topic))
	}
	if call.MessageUUID != "" {
		attrs = append(attrs, attribute.String("messaging.message.id", call.MessageUUID))
	}
	if t.recordKeys {
		attrs = append(attrs, attribute.String("dedup.key", call.Key))
	}
	ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	return ctx, callSpan{span}
}

// callSpan is the span of one call. The span is safe for concurrent use,
// and callSpan keeps no state of its own.
type callSpan struct{ span trace.Span }

func (c callSpan) ObserveDecision(d dedup.Decision) {
	attrs := []attribute.KeyValue{}
	if d.Op != "" {
		attrs = append(attrs, attribute.String("dedup.op", d.Op))
	}
	if d.Err != nil {
		attrs = append(attrs, attribute.String("error.message", d.Err.Error()))
	}
	c.span.AddEvent("dedup."+string(d.Event), trace.WithAttributes(attrs...))

	if outcome := outcomeOf(d); outcome != "" {
		summary := []attribute.KeyValue{
			attribute.String("dedup.outcome", outcome),
			attribute.Bool("dedup.replayed", d.Replayed),
			attribute.Bool("dedup.shadow", d.Event == event.WouldSkip || d.Event == event.WouldReject),
		}
		if d.Waited > 0 {
			summary = append(summary, attribute.Float64("dedup.waited_s", d.Waited.Seconds()))
		}
		c.span.SetAttributes(summary...)
	}
	switch d.Event {
	case event.ClaimLost, event.StoreError, event.FailOpen, event.KeyMissing, event.TransportKey, event.KeyReuse:
		c.span.SetStatus(codes.Error, string(d.Event))
	}
}

// outcomeOf is the dedup.outcome of a claim decision, "" for the others
// (completed, released, claim_lost of a later operation, fail_open).
func outcomeOf(d dedup.Decision) string {
	switch {
	case d.Event == event.TransportKey || d.Event == event.WouldReject && d.Outcome == 0 && errors.Is(d.Err, dedup.ErrTransportKey):
		return "transport_key"
	case d.Event == event.KeyMissing || d.Event == event.WouldReject && d.Outcome == 0:
		return "no_key"
	case d.Event == event.StoreError && d.Op == "claim":
		return "store_error"
	case d.Op == "claim" && d.Outcome != 0:
		return d.Outcome.String()
	}
	return ""
}

func (c callSpan) ObserveStoreOp(op string, elapsed time.Duration, err error) {
	result := "ok"
	switch {
	case errors.Is(err, dedup.ErrClaimLost):
		result = "claim_lost"
	case err != nil:
		result = "error"
	}
	c.span.AddEvent("dedup.store."+op, trace.WithAttributes(
		attribute.Float64("duration_s", elapsed.Seconds()), attribute.String("result", result)))
	c.span.SetAttributes(attribute.Float64("dedup.store."+op+".duration_s", elapsed.Seconds()))
}

func (c callSpan) EndCall(_ dedup.ClaimResult, err error) {
	if err != nil && !errors.Is(err, dedup.ErrInProgress) {
		c.span.RecordError(err)
		c.span.SetStatus(codes.Error, err.Error())
	}
	c.span.End()
}
