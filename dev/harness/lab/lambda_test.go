package lab_test

import (
	"context"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/lab"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// The lab in Lambda shape: every copy charged without the adapter, every
// order once with it, every record processed in the end.
func TestLabLambdaRuntime(t *testing.T) {
	cfg := lab.Config{
		Copies: 10, Orders: 200, MaxDuplicates: 4, Concurrency: 5, EffectTime: time.Millisecond,
		NewStore: func(context.Context) (dedup.Store, error) { return memstore.New(nil), nil },
	}
	results, err := lab.RunLambda(context.Background(), cfg, true, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 {
		t.Fatalf("%d results, want 2", len(results))
	}
	off, on := results[0], results[1]
	if !off.OK() || off.Charges != off.Messages {
		t.Errorf("off: %d charges, %d acked for %d messages", off.Charges, off.Acked, off.Messages)
	}
	if !on.OK() || on.Charges != 201 || on.Outcomes[event.ClaimWon] != 201 {
		t.Errorf("on: %d charges (%d claims won) for %d orders, %d acked of %d", on.Charges, on.Outcomes[event.ClaimWon], on.DistinctOrders, on.Acked, on.Messages)
	}
	if on.HandlerErrors != on.Outcomes[event.InProgress] {
		t.Errorf("on: %d batch item failures, want one per in-progress copy (%d)", on.HandlerErrors, on.Outcomes[event.InProgress])
	}
	if _, err := lab.RunLambda(context.Background(), lab.Config{LoseAcks: 1, NewStore: cfg.NewStore}, true, true); err == nil {
		t.Error("RunLambda accepted LoseAcks")
	}
}
