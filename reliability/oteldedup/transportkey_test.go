package oteldedup_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/codes"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/oteldedup"
)

// TestSpanOfATransportKey: a key equal to the message's transport id is
// its own outcome, transport_key (event dedup.transport_key, status
// Error), not no_key / key_missing.
func TestSpanOfATransportKey(t *testing.T) {
	tp, rec := newProvider(t)
	tracer := oteldedup.New(oteldedup.Config{TracerProvider: tp})
	d, err := dedup.New(dedup.Config{Store: memstore.New(nil), Scope: "s", Tracer: tracer,
		Key: func(msg *message.Message) (string, error) { return msg.UUID, nil }})
	if err != nil {
		t.Fatal(err)
	}
	h := tracer.Middleware(d.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil }))
	if _, err := h(message.NewMessage("uuid-1", nil)); !errors.Is(err, dedup.ErrTransportKey) {
		t.Fatalf("handler returned %v, want ErrTransportKey", err)
	}
	spans := spansNamed(rec, "dedup")
	if len(spans) != 1 {
		t.Fatalf("%d dedup spans, want 1", len(spans))
	}
	s := spans[0]
	if a := attrs(s); a["dedup.outcome"].AsString() != "transport_key" || !slices.Contains(eventNames(s), "dedup.transport_key") || s.Status().Code != codes.Error {
		t.Errorf("span: attributes %v, events %v, status %v; want outcome transport_key, event dedup.transport_key, status Error", a, eventNames(s), s.Status())
	}
}
