package oteldedup_test

import (
	"context"
	"fmt"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/oteldedup"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// Two calls for ORDER-003: the first runs and is recorded, the second is a
// duplicate whose stored result comes back. Each is one span; its
// attributes tell a fresh run from a replay.
func Example() {
	recorder := tracetest.NewSpanRecorder()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	defer func() { _ = provider.Shutdown(context.Background()) }()

	store, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		panic(err)
	}
	engine, err := dedup.NewEngine(dedup.Config{
		Store:  store,
		Tracer: oteldedup.New(oteldedup.Config{TracerProvider: provider}),
	})
	if err != nil {
		panic(err)
	}
	call := dedup.Call{Scope: "charge", Key: "ORDER-003", Handler: "charge"}
	for range 2 {
		_, err := engine.Do(context.Background(), call, func(ctx context.Context) ([]byte, error) {
			return []byte(`{"charged":150}`), nil
		})
		if err != nil {
			panic(err)
		}
	}
	for _, span := range recorder.Ended() {
		fmt.Print(span.Name(), ":")
		for _, kv := range span.Attributes() {
			switch kv.Key {
			case "dedup.outcome", "dedup.replayed":
				fmt.Printf(" %s=%s", kv.Key, kv.Value.Emit())
			}
		}
		fmt.Print("\n  events:")
		for _, e := range span.Events() {
			fmt.Print(" ", e.Name)
		}
		fmt.Println()
	}
	// Output:
	// dedup charge: dedup.outcome=acquired dedup.replayed=false
	//   events: dedup.store.claim dedup.claim_won dedup.store.complete dedup.completed
	// dedup charge: dedup.outcome=duplicate dedup.replayed=true
	//   events: dedup.store.claim dedup.skip_duplicate
}
