package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// faultyBatchStore fails a batch part-way as a dropped connection does:
// ClaimBatch runs the claims of records up to and including failAt (the
// server ran them) but answers only those before it; CompleteBatch does
// not run the completion of the key completeFail.
type faultyBatchStore struct {
	*memory.Store
	failAt       int
	completeFail string // the key whose completion never runs
}

var errDropped = errors.New("connection dropped (test)")

func (s faultyBatchStore) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.ClaimResult, []error) {
	n := min(s.failAt+1, len(reqs))
	res, errs := s.Store.ClaimBatch(ctx, reqs[:n])
	for i := s.failAt; i < len(reqs); i++ {
		if i < len(res) {
			res[i], errs[i] = dedup.ClaimResult{}, errDropped
		} else {
			res, errs = append(res, dedup.ClaimResult{}), append(errs, errDropped)
		}
	}
	return res, errs
}

func (s faultyBatchStore) CompleteBatch(ctx context.Context, reqs []dedup.CompleteRequest) []error {
	var errs []error
	for _, r := range reqs {
		if r.Claim.Key == s.completeFail {
			errs = append(errs, errDropped)
			continue
		}
		errs = append(errs, s.Store.CompleteBatch(ctx, []dedup.CompleteRequest{r})...)
	}
	return errs
}

// TestDoBatchStoreFailsPartWay: a claim batch that fails from its fifth
// record (whose claim the store ran without answering) and a completion
// that fails for one record: the answered records run, the others are
// store errors and do not run, and once the lease has passed no record of
// the batch is in progress: each is completed, or free to claim.
func TestDoBatchStoreFailsPartWay(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(batchEpoch)
	mem := memstore.New(clock)
	const lease = time.Minute
	e, err := dedup.NewEngine(dedup.Config{Store: faultyBatchStore{Store: mem, failAt: 4, completeFail: "s:k1"}, Clock: clock,
		Lease: lease, Retention: time.Hour, CompleteRetries: 1, CompleteBackoff: time.Second, DisableHeartbeat: true})
	if err != nil {
		t.Fatal(err)
	}
	var calls []dedup.BatchCall
	for i := range 8 {
		calls = append(calls, dedup.BatchCall{Call: dedup.Call{Scope: "s", Key: fmt.Sprint("k", i)}})
	}
	var ran atomic.Int32
	done := make(chan []batchResult, 1)
	go func() {
		done <- doBatch(e, ctx, dedup.Batch{Calls: calls}, func(ctx context.Context, i int) ([]byte, error) {
			ran.Add(1)
			return nil, nil
		})
	}()
	// The failed completion is retried once, after CompleteBackoff, and
	// fails again.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := clock.WaitForTimerAt(wctx, batchEpoch.Add(time.Second)); err != nil {
		t.Fatalf("no retry of the failed completion: %v", err)
	}
	clock.Advance(time.Second)
	var res []batchResult
	select {
	case res = <-done:
	case <-wctx.Done():
		t.Fatal("DoBatch did not return")
	}
	if ran.Load() != 4 {
		t.Fatalf("ran %d calls, want the 4 answered", ran.Load())
	}
	for i, r := range res {
		var se *dedup.StoreError
		if i < 4 && (r.Err != nil || r.Outcome != dedup.Acquired) {
			t.Fatalf("call %d: %v %v, want acquired (a failed completion is logged, as Do does)", i, r.Outcome, r.Err)
		}
		if i >= 4 && (!errors.As(r.Err, &se) || !errors.Is(r.Err, errDropped)) {
			t.Fatalf("call %d: %v, want a *StoreError", i, r.Err)
		}
	}
	// Record 4 was claimed without an answer, record 1 not completed: both
	// in progress, until their lease ends.
	for _, k := range []string{"s:k1", "s:k4"} {
		if r, err := mem.Claim(ctx, k, "", lease); err != nil || r.Outcome != dedup.InProgress {
			t.Fatalf("before the lease ends, Claim(%q) = %v %v; want in progress", k, r.Outcome, err)
		}
	}
	clock.Advance(lease - time.Second)
	for i := range calls {
		key := "s:k" + fmt.Sprint(i)
		want := dedup.Acquired
		if i < 4 && i != 1 {
			want = dedup.Duplicate
		}
		if r, err := mem.Claim(ctx, key, "", lease); err != nil || r.Outcome != want {
			t.Fatalf("after the lease, Claim(%q) = %v %v; want %v", key, r.Outcome, err, want)
		}
	}
}
