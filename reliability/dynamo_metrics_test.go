package reliability_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/metrics"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// Moved from stores/dynamo: it needs the metrics module, which the
// DynamoDB store's module does not require.

// Issue 13, failure 3: with Replay on and an output too large for one
// DynamoDB item, the middleware reported two decisions with op "complete"
// (the lost replay and the completion), and the Prometheus gauge
// claims_in_flight ended at -1 per message. It must end at 0.
func TestTooLargeReplayKeepsClaimsInFlightAtZero(t *testing.T) {
	store, err := dynamo.New(context.Background(), dynamo.Config{Client: newDynamoClient(dynamoEndpoint), Table: dynamoTable, SkipTTL: true})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg, metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := dedup.New(dedup.Config{Store: store, Key: keyfuncs.JSON("order_id"), Scope: t.Name(), Replay: true, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage(watermill.NewUUID(), bytes.Repeat([]byte("r"), 500_000))}, nil
	})
	for i := range 3 {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"ORDER-`+watermill.NewUUID()+`"}`))
		msg.SetContext(context.Background())
		if _, err := h(msg); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range families {
		if !strings.HasSuffix(f.GetName(), "claims_in_flight") {
			continue
		}
		for _, m := range f.GetMetric() {
			found = true
			if v := m.GetGauge().GetValue(); v != 0 {
				t.Fatalf("claims_in_flight = %v after 3 messages, want 0", v)
			}
		}
	}
	if !found {
		t.Fatal("no claims_in_flight series")
	}
}
