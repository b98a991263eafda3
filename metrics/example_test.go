package metrics_test

import (
	"context"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/metrics"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// The observer counts every decision: three deliveries of one order are one
// claim won (completed) and two duplicates skipped. In a service, register
// on prometheus.DefaultRegisterer and serve promhttp.Handler().
func ExampleNew() {
	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg, metrics.Config{})
	if err != nil {
		panic(err)
	}
	store, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		panic(err)
	}
	engine, err := dedup.NewEngine(dedup.Config{Store: store, Observer: obs})
	if err != nil {
		panic(err)
	}
	charge := func(context.Context) ([]byte, error) { return nil, nil }
	for range 3 {
		call := dedup.Call{Scope: "charge-orders", Key: "ORDER-003", Handler: "charge-orders"}
		if _, err := engine.Do(context.Background(), call, charge); err != nil {
			panic(err)
		}
	}

	families, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, f := range families { // as /metrics shows them
		if f.GetName() == "dedup_decisions_total" {
			_, _ = expfmt.MetricFamilyToText(os.Stdout, f)
		}
	}
	// Output:
	// # HELP dedup_decisions_total Decisions of the dedup middleware, by handler and event (claim_won, completed, skip_duplicate, in_progress, released, claim_lost, key_missing, transport_key, key_reuse, store_error, fail_open, would_skip, would_reject).
	// # TYPE dedup_decisions_total counter
	// dedup_decisions_total{event="claim_won",handler="charge-orders"} 1
	// dedup_decisions_total{event="completed",handler="charge-orders"} 1
	// dedup_decisions_total{event="skip_duplicate",handler="charge-orders"} 2
}
