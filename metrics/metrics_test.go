package metrics_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/metrics"
)

// A run with known duplicates: 20 orders × 3 copies, the first delivery of
// ORDER-0 fails once, and one message has no key.
func TestMetricsCountEveryDecision(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	obs, err := metrics.New(reg, metrics.Config{ConstLabels: prometheus.Labels{"service": "billing"}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := dedup.New(dedup.Config{Store: memstore.New(nil), Key: keyfuncs.JSON("order_id"), Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	poison, err := middleware.PoisonQueueWithFilter(pubSub, "poison", dedup.IsPermanent)
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(poison, d.Middleware)
	var failed atomic.Bool
	router.AddConsumerHandler("charge", "orders", pubSub, func(m *message.Message) error {
		if strings.Contains(string(m.Payload), `"ORDER-0"`) && failed.CompareAndSwap(false, true) {
			return fmt.Errorf("gateway timeout")
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-runErr:
		t.Fatalf("router stopped at once: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("router did not start within 30s")
	}
	for range 3 {
		for i := range 20 {
			m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"order_id":"ORDER-%d"}`, i)))
			if err := pubSub.Publish("orders", m); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := pubSub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(`{}`))); err != nil {
		t.Fatal(err)
	}
	if err := router.Close(); err != nil {
		t.Fatal(err)
	}

	want := map[string]float64{
		"claim_won": 21, "completed": 20, "released": 1, "skip_duplicate": 40, "key_missing": 1,
		"in_progress": 0, "claim_lost": 0, "store_error": 0,
	}
	for event, n := range want {
		got := counterSum(t, reg, "dedup_decisions_total", map[string]string{"handler": "charge", "event": event, "service": "billing"})
		if got != n {
			t.Errorf("decisions{event=%q} = %v, want %v", event, got, n)
		}
	}
	if got := gaugeValue(t, reg, "dedup_claims_in_flight"); got != 0 {
		t.Errorf("claims in flight after the run = %v, want 0", got)
	}
	counts := histogramCounts(t, reg, "dedup_store_operation_duration_seconds")
	for k, n := range map[string]uint64{"claim/ok": 61, "complete/ok": 20, "release/ok": 1} {
		if counts[k] != n {
			t.Errorf("latency samples %s = %d, want %d (all: %v)", k, counts[k], n, counts)
		}
	}
}

func TestRegisteringTwiceFails(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := metrics.New(reg, metrics.Config{}); err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.New(reg, metrics.Config{}); err == nil {
		t.Fatal("second registration succeeded")
	}
	if _, err := metrics.New(reg, metrics.Config{Namespace: "payments_dedup"}); err != nil {
		t.Fatalf("other namespace: %v", err)
	}
	if _, err := metrics.New(nil, metrics.Config{}); err == nil {
		t.Fatal("nil registerer accepted")
	}
}

func TestInFlightGaugeWhileHandlerRuns(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg, metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := dedup.New(dedup.Config{Store: memstore.New(nil), Key: keyfuncs.JSON("id"), Scope: "s", Observer: obs, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	inside := make(chan float64, 1)
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		inside <- gaugeValue(t, reg, "dedup_claims_in_flight")
		return nil, nil
	})
	if _, err := h(message.NewMessage("u", []byte(`{"id":"a"}`))); err != nil {
		t.Fatal(err)
	}
	if v := <-inside; v != 1 {
		t.Fatalf("in flight during the handler = %v, want 1", v)
	}
	if v := gaugeValue(t, reg, "dedup_claims_in_flight"); v != 0 {
		t.Fatalf("in flight after = %v, want 0", v)
	}
}
