package oteldedup_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/oteldedup"
)

func newProvider(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rec
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

func eventNames(s sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, e := range s.Events() {
		out = append(out, e.Name)
	}
	return out
}

// spansNamed returns the ended spans with the name.
func spansNamed(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// describe is a span in one line, for the README's traced run.
func describe(s sdktrace.ReadOnlySpan, parent string) string {
	a := attrs(s)
	line := fmt.Sprintf("%s (trace %s…, child of %q): outcome=%s replayed=%v shadow=%v", s.Name(),
		s.SpanContext().TraceID().String()[:8], parent, a["dedup.outcome"].Emit(), a["dedup.replayed"].Emit(), a["dedup.shadow"].Emit())
	if w, ok := a["dedup.waited_s"]; ok {
		line += fmt.Sprintf(" waited=%.0fms", w.AsFloat64()*1000)
	}
	for _, op := range []string{"claim", "complete", "release"} {
		if d, ok := a[attribute.Key("dedup.store."+op+".duration_s")]; ok {
			line += fmt.Sprintf(" %s=%.2fms", op, d.AsFloat64()*1000)
		}
	}
	return line + fmt.Sprintf("\n    events %v", eventNames(s))
}

// Three copies of ORDER-003, each published under a producer span whose
// context travels in the message's traceparent metadata, through a
// Watermill router with the Deduplicator (replay on) on a real Redis: one
// dedup span per copy, each a child of its producer's span; the first
// acquired (the handler's span its child), the others duplicates replayed.
func TestSpansThroughARouterOnRedis(t *testing.T) {
	tp, rec := newProvider(t)
	tracer := oteldedup.New(oteldedup.Config{TracerProvider: tp, RecordKeys: true})
	d, err := dedup.New(dedup.Config{Store: newRedisStore(t), Key: keyfuncs.JSON("order_id"), Replay: true, Tracer: tracer})
	if err != nil {
		t.Fatal(err)
	}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(tracer.Middleware, d.Middleware)
	var (
		mu       sync.Mutex
		outcomes []string
	)
	router.AddHandler("charge-orders", "orders", pubSub, "receipts", pubSub, func(msg *message.Message) ([]*message.Message, error) {
		_, span := tp.Tracer("billing").Start(msg.Context(), "charge")
		defer span.End()
		o, ok := dedup.OutcomeFromContext(msg.Context())
		mu.Lock()
		outcomes = append(outcomes, fmt.Sprint(o, ok))
		mu.Unlock()
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(`{"receipt":"ORDER-003"}`))}, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	receiptMsgs, err := pubSub.Subscribe(ctx, "receipts")
	if err != nil {
		t.Fatal(err)
	}
	receipts := make(chan struct{}, 3)
	go func() {
		for r := range receiptMsgs { // the router's publish waits for this ack
			r.Ack()
			receipts <- struct{}{}
		}
	}()
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	recv(t, "the router to start", router.Running())

	var producers []trace.SpanContext
	var uuids []string
	for i := range 3 {
		pctx, span := tp.Tracer("checkout").Start(context.Background(), fmt.Sprintf("publish ORDER-003 #%d", i+1))
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"ORDER-003","amount":150}`))
		propagation.TraceContext{}.Inject(pctx, propagation.MapCarrier(msg.Metadata))
		span.End()
		producers, uuids = append(producers, span.SpanContext()), append(uuids, msg.UUID)
		if err := pubSub.Publish("orders", msg); err != nil { // returns once acked
			t.Fatal(err)
		}
		recv(t, "a receipt (published or replayed)", receipts)
	}
	if err := router.Close(); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, "the router to stop", runErr); err != nil {
		t.Fatal(err)
	}

	dedupSpans := spansNamed(rec, "dedup charge-orders")
	if len(dedupSpans) != 3 {
		t.Fatalf("%d dedup spans, want 3 (one per copy)", len(dedupSpans))
	}
	var report []string
	for i, p := range producers {
		at := slices.IndexFunc(dedupSpans, func(s sdktrace.ReadOnlySpan) bool { return s.Parent().SpanID() == p.SpanID() })
		if at < 0 {
			t.Fatalf("no dedup span is a child of producer span %d", i+1)
		}
		s := dedupSpans[at]
		report = append(report, describe(s, fmt.Sprintf("publish ORDER-003 #%d", i+1)))
		a := attrs(s)
		if s.SpanContext().TraceID() != p.TraceID() || a["dedup.scope"].AsString() != "charge-orders" ||
			a["dedup.key"].AsString() != "ORDER-003" || a["messaging.message.id"].AsString() != uuids[i] ||
			a["messaging.destination.name"].AsString() != "orders" || s.Status().Code != codes.Unset {
			t.Errorf("span of copy %d: trace %s (want %s), attributes %v, status %v", i+1, s.SpanContext().TraceID(), p.TraceID(), a, s.Status())
		}
		if _, ok := a["dedup.store.claim.duration_s"]; !ok {
			t.Errorf("span of copy %d has no claim timing: %v", i+1, a)
		}
		want := struct {
			outcome  string
			replayed bool
			events   []string
		}{"duplicate", true, []string{"dedup.store.claim", "dedup.skip_duplicate"}}
		if i == 0 {
			want.outcome, want.replayed = "acquired", false
			want.events = []string{"dedup.store.claim", "dedup.claim_won", "dedup.store.complete", "dedup.completed"}
			if _, ok := a["dedup.store.complete.duration_s"]; !ok {
				t.Errorf("the first copy's span has no complete timing: %v", a)
			}
			charges := spansNamed(rec, "charge")
			if len(charges) != 1 || charges[0].Parent().SpanID() != s.SpanContext().SpanID() {
				t.Errorf("handler spans %d, want one, a child of the first copy's dedup span", len(charges))
			}
		}
		if a["dedup.outcome"].AsString() != want.outcome || a["dedup.replayed"].AsBool() != want.replayed || !slices.Equal(eventNames(s), want.events) {
			t.Errorf("span of copy %d: outcome %s replayed %v events %v; want %s %v %v", i+1,
				a["dedup.outcome"].Emit(), a["dedup.replayed"].Emit(), eventNames(s), want.outcome, want.replayed, want.events)
		}
	}
	if !slices.Equal(outcomes, []string{"acquired true"}) {
		t.Errorf("the handler saw %v, want one fresh run (acquired true)", outcomes)
	}
	t.Log("traced run:\n" + strings.Join(report, "\n"))
}

// countingObserver counts claims, so that a test knows when a waiting call
// has met the key in progress.
type countingObserver struct {
	mu     sync.Mutex
	claims int
	met    chan struct{}
	want   int
}

func (o *countingObserver) ObserveDecision(dedup.Decision) {}
func (o *countingObserver) ObserveStoreOp(op string, _ time.Duration, _ error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if op == "claim" {
		if o.claims++; o.claims == o.want {
			close(o.met)
		}
	}
}

// A call that waited for the holder (InProgressWait) and a shadow run of a
// duplicate, on a real Redis: their spans say so.
func TestSpansOfAWaitAndAShadowRun(t *testing.T) {
	tp, rec := newProvider(t)
	tracer := oteldedup.New(oteldedup.Config{TracerProvider: tp})
	store := newRedisStore(t)
	obs := &countingObserver{met: make(chan struct{}), want: 2}
	waiting, err := dedup.NewEngine(dedup.Config{Store: store, Tracer: tracer, Observer: obs,
		InProgressWait: time.Minute, InProgressPoll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	call := dedup.Call{Scope: "charge", Key: "ORDER-003", Handler: "charge"}
	holder, entered := make(chan error, 1), make(chan struct{})
	go func() {
		_, err := waiting.Do(context.Background(), call, func(context.Context) ([]byte, error) {
			close(entered)
			select { // the second call's first claim finds the key in progress
			case <-obs.met:
			case <-time.After(time.Minute):
				return nil, fmt.Errorf("waited a minute for the second call's claim")
			}
			return []byte("charged"), nil
		})
		holder <- err
	}()
	recv(t, "the holder's work to start", entered)
	res, err := waiting.Do(context.Background(), call, func(context.Context) ([]byte, error) { return nil, nil })
	if err != nil || res.Outcome != dedup.Duplicate {
		t.Fatalf("waiting call: %+v, %v; want a duplicate", res, err)
	}
	if err := recv(t, "the holder", holder); err != nil {
		t.Fatal(err)
	}
	shadow, err := dedup.NewEngine(dedup.Config{Store: store, Tracer: tracer, Shadow: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shadow.Do(context.Background(), call, func(ctx context.Context) ([]byte, error) {
		if o, _ := dedup.OutcomeFromContext(ctx); o != dedup.Duplicate {
			t.Errorf("shadow run of a duplicate: outcome %v in its context", o)
		}
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}

	spans := spansNamed(rec, "dedup charge")
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3", len(spans))
	}
	var waited, shadowed sdktrace.ReadOnlySpan
	for _, s := range spans {
		a := attrs(s)
		if _, ok := a["dedup.waited_s"]; ok {
			waited = s
		}
		if a["dedup.shadow"].AsBool() {
			shadowed = s
		}
	}
	if waited == nil || attrs(waited)["dedup.outcome"].AsString() != "duplicate" || !attrs(waited)["dedup.replayed"].AsBool() ||
		attrs(waited)["dedup.waited_s"].AsFloat64() <= 0 {
		t.Errorf("no span of a wait that ended in a replayed duplicate: %v", spans)
	}
	if shadowed == nil || attrs(shadowed)["dedup.outcome"].AsString() != "duplicate" || !slices.Contains(eventNames(shadowed), "dedup.would_skip") {
		t.Errorf("no span of a shadow run of a duplicate (would_skip): %v", spans)
	}
	t.Logf("wait: %s\nshadow: %s", describe(waited, "none"), describe(shadowed, "none"))
}
