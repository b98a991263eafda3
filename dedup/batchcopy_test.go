package dedup_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// TestDoBatchCopyInAnEarlierGroupRunsFirst proves that of two calls of
// one key in different groups, the one that takes its turn first runs,
// and the other is its Duplicate, even when the first by batch index is
// in the group that runs later: calls [g2:other, g1:k, g2:k] with
// Concurrency 1 take their turns g2 first (other, then k) and g1 after.
// With Config.InProgressWait (a minute, on a fake clock that the test
// does not move) the batch ends at once: no call waits for one that
// cannot start before it. k's work runs once, both of k's calls succeed,
// and a redelivery of the batch is a Duplicate for every call. (The
// first call of a key was the lowest batch index: g2's k waited the whole
// InProgressWait for g1's k, queued behind it, then failed in progress.)
func TestDoBatchCopyInAnEarlierGroupRunsFirst(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(batchEpoch)
	mem := memstore.New(clock)
	b := calls("s", "other", "k", "k")
	b[0].Group, b[1].Group, b[2].Group = "g2", "g1", "g2"

	var (
		mu  sync.Mutex
		ran []int
	)
	work := func(_ context.Context, i int) ([]byte, error) {
		mu.Lock()
		ran = append(ran, i)
		mu.Unlock()
		return []byte(b[i].Key + " done"), nil
	}
	e := newObservedBatchEngine(t, mem, clock, nil, false, time.Minute)
	done := make(chan []batchResult, 1)
	go func() { done <- doBatch(e, ctx, dedup.Batch{Calls: b, Concurrency: 1}, work) }()
	var res []batchResult
	select {
	case res = <-done:
	case <-time.After(realTimeBound):
		t.Errorf("the batch has not ended %v after it started: g2's copy of k waits (InProgressWait, on the fake clock) for g1's k, which cannot start before g2's turn ends",
			realTimeBound)
		clock.Advance(time.Minute) // the wait's end, to see how the batch ends
		select {
		case res = <-done:
		case <-time.After(realTimeBound):
			t.Fatalf("the batch has not ended %v after its InProgressWait did", realTimeBound)
		}
	}

	mu.Lock()
	defer mu.Unlock()
	runsOfK := 0
	for _, i := range ran {
		if b[i].Key == "k" {
			runsOfK++
		}
	}
	if runsOfK != 1 || !slices.Contains(ran, 0) {
		t.Errorf("works ran for calls %v; want other's (0) and one of k's (1 or 2)", ran)
	}
	for i, r := range res {
		if r.Err != nil {
			t.Errorf("call %d (%s:%s): %v; want success", i, b[i].Group, b[i].Key, r.Err)
		}
	}
	if k1, k2 := res[1].Outcome, res[2].Outcome; !(k1 == dedup.Acquired && k2 == dedup.Duplicate || k1 == dedup.Duplicate && k2 == dedup.Acquired) {
		t.Errorf("k's calls: g1 %v, g2 %v; want one acquired and the other its duplicate", k1, k2)
	}
	for i := 1; i <= 2; i++ {
		if res[i].Err == nil && string(res[i].Result) != "k done" {
			t.Errorf("call %d (%s:k): result %q, want %q", i, b[i].Group, res[i].Result, "k done")
		}
	}
	if t.Failed() {
		return
	}

	// Redelivered: every call a duplicate, no work.
	ran = nil
	again := doBatch(newObservedBatchEngine(t, mem, clock, nil, false, time.Minute), ctx, dedup.Batch{Calls: b, Concurrency: 1},
		func(_ context.Context, i int) ([]byte, error) {
			t.Errorf("redelivery: the work of call %d ran", i)
			return nil, nil
		})
	for i, r := range again {
		if r.Err != nil || r.Outcome != dedup.Duplicate {
			t.Errorf("redelivered call %d (%s:%s): %v %v; want a duplicate", i, b[i].Group, b[i].Key, r.Outcome, r.Err)
		}
	}
}
