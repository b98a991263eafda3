package oteldedup_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/oteldedup"
)

// A message without a key is refused before any claim, and still gets its
// span, a child of the producer's: outcome no_key and status Error; in
// shadow mode (would_reject) the handler runs as the span's child and the
// status stays unset. (The middleware made no span for it before.)
func TestSpanOfAMessageWithoutKey(t *testing.T) {
	for _, shadow := range []bool{false, true} {
		t.Run(map[bool]string{false: "refused", true: "shadow"}[shadow], func(t *testing.T) {
			tp, rec := newProvider(t)
			tracer := oteldedup.New(oteldedup.Config{TracerProvider: tp})
			d, err := dedup.New(dedup.Config{Store: newRedisStore(t), Key: keyfuncs.JSON("order_id"), Shadow: shadow, Tracer: tracer})
			if err != nil {
				t.Fatal(err)
			}
			ran := 0
			h := tracer.Middleware(d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				ran++
				_, span := tp.Tracer("billing").Start(msg.Context(), "charge")
				span.End()
				return nil, nil
			}))
			pctx, producer := tp.Tracer("checkout").Start(context.Background(), "publish")
			msg := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":150}`))
			propagation.TraceContext{}.Inject(pctx, propagation.MapCarrier(msg.Metadata))
			producer.End()

			_, err = h(msg)
			if shadow != (err == nil) || !shadow && !errors.Is(err, dedup.ErrNoKey) {
				t.Fatalf("handler returned %v (shadow %v); want ErrNoKey unless shadow", err, shadow)
			}
			spans := spansNamed(rec, "dedup")
			if len(spans) != 1 {
				t.Fatalf("%d dedup spans, want 1", len(spans))
			}
			s := spans[0]
			a := attrs(s)
			wantEvents, wantStatus := []string{"dedup.key_missing", "exception"}, codes.Error // the call's error is recorded
			if shadow {
				wantEvents, wantStatus = []string{"dedup.would_reject"}, codes.Unset
			}
			if s.Parent().SpanID() != producer.SpanContext().SpanID() || a["dedup.outcome"].AsString() != "no_key" ||
				a["dedup.shadow"].AsBool() != shadow || !slices.Equal(eventNames(s), wantEvents) || s.Status().Code != wantStatus {
				t.Errorf("span: parent %s (want the producer's), attributes %v, events %v, status %v", s.Parent().SpanID(), a, eventNames(s), s.Status())
			}
			charges := spansNamed(rec, "charge")
			if want := map[bool]int{false: 0, true: 1}[shadow]; ran != want || len(charges) != want {
				t.Fatalf("handler ran %d times with %d spans, want %d", ran, len(charges), want)
			}
			if shadow && charges[0].Parent().SpanID() != s.SpanContext().SpanID() {
				t.Errorf("the shadow run's span is not a child of the dedup span")
			}
		})
	}
}
