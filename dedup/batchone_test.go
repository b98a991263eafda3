package dedup_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// batchCounting is the memory store, counting the batch requests it gets.
type batchCounting struct {
	*memory.Store
	batches atomic.Int32
}

func (s *batchCounting) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.ClaimResult, []error) {
	s.batches.Add(1)
	return s.Store.ClaimBatch(ctx, reqs)
}

func (s *batchCounting) CompleteBatch(ctx context.Context, reqs []dedup.CompleteRequest) []error {
	s.batches.Add(1)
	return s.Store.CompleteBatch(ctx, reqs)
}

// TestDoBatchOfOneIsDo: a batch of one call is decided by Do, with the
// store's single-record methods (no batch request), and Batch.Stops sees
// its end once; a repeat of it is Do's duplicate, with the first result.
func TestDoBatchOfOneIsDo(t *testing.T) {
	store := &batchCounting{Store: memstore.New(nil)}
	e, err := dedup.NewEngine(dedup.Config{Store: store, Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var stops []error
	batch := dedup.Batch{
		Calls: []dedup.BatchCall{{Call: dedup.Call{Scope: "s", Key: "order-1"}}},
		Stops: func(i int, _ dedup.ClaimResult, err error) bool { stops = append(stops, err); return err != nil },
	}
	runs := 0
	fn := func(context.Context, int) ([]byte, error) { runs++; return []byte("charged"), nil }
	res, errs := e.DoBatch(ctx, batch, fn)
	if errs[0] != nil || res[0].Outcome != dedup.Acquired || string(res[0].Result) != "charged" || runs != 1 {
		t.Fatalf("first: %v %v %q, %d runs", res[0].Outcome, errs[0], res[0].Result, runs)
	}
	res, errs = e.DoBatch(ctx, batch, fn)
	if errs[0] != nil || res[0].Outcome != dedup.Duplicate || string(res[0].Result) != "charged" || runs != 1 {
		t.Fatalf("repeat: %v %v %q, %d runs", res[0].Outcome, errs[0], res[0].Result, runs)
	}
	if len(stops) != 2 || stops[0] != nil || stops[1] != nil {
		t.Errorf("Stops saw %v, want two nil errors", stops)
	}
	if n := store.batches.Load(); n != 0 {
		t.Errorf("%d batch requests for batches of one, want none (Do's requests)", n)
	}
}
