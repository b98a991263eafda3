package dedup_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// gatedCompletes is a batch store whose first CompleteBatch waits until
// gate is closed, and which records the size of every CompleteBatch.
type gatedCompletes struct {
	batchStore
	started chan struct{} // closed when the first CompleteBatch is called
	gate    chan struct{}
	first   sync.Once
	sizes   []int
}

func (s *gatedCompletes) CompleteBatch(ctx context.Context, reqs []dedup.CompleteRequest) []error {
	s.first.Do(func() {
		close(s.started)
		select {
		case <-s.gate:
		case <-time.After(time.Minute):
			panic("the first CompleteBatch waited a minute for its gate")
		}
	})
	s.mu.Lock()
	s.sizes = append(s.sizes, len(reqs))
	s.mu.Unlock()
	return s.batchStore.CompleteBatch(ctx, reqs)
}

// gateOnDuplicate closes gate at the first skip_duplicate decision.
type gateOnDuplicate struct {
	gate chan struct{}
	once sync.Once
}

func (o *gateOnDuplicate) ObserveDecision(d dedup.Decision) {
	if d.Event == event.SkipDuplicate {
		o.once.Do(func() { close(o.gate) })
	}
}

func (o *gateOnDuplicate) ObserveStoreOp(string, time.Duration, error) {}

// TestDoBatchCompletionsStream: a call's completion is sent as soon as its
// work returns, while later calls run, and the completions that end while
// it is in flight go together in the next request. Calls a, b, c, d run one
// after the other; b's work waits until a's completion has reached the
// store, which holds it until the last call (a duplicate) is decided,
// after b, c and d have ended: the requests carry [a] and then [b c d].
// With completions sent after the last call, as before, b would wait for
// ever.
func TestDoBatchCompletionsStream(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(batchEpoch)
	mem := memstore.New(clock)
	gate := make(chan struct{})
	started := make(chan struct{})
	store := &gatedCompletes{batchStore: batchStore{&countingStore{Store: mem, mem: mem}}, started: started, gate: gate}
	e, err := dedup.NewEngine(dedup.Config{Store: store, Clock: clock, Lease: time.Minute, Retention: time.Hour,
		Observer: &gateOnDuplicate{gate: gate}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Do(ctx, dedup.Call{Scope: "s", Key: "old"}, func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	store.mu.Lock()
	store.sizes = nil
	store.mu.Unlock()
	res := doBatch(e, ctx, dedup.Batch{Calls: calls("s", "a", "b", "c", "d", "old")}, func(_ context.Context, i int) ([]byte, error) {
		if i == 1 {
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				return nil, errors.New("a's completion did not reach the store while b ran")
			}
		}
		return []byte("ok"), nil
	})
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("call %d: %v", i, r.Err)
		}
	}
	if !slices.Equal(store.sizes, []int{1, 3}) {
		t.Fatalf("CompleteBatch sizes %v, want [1 3]: a's alone as it ended, then the three that ended meanwhile", store.sizes)
	}
	for _, key := range []string{"s:a", "s:b", "s:c", "s:d"} {
		if r, err := mem.Claim(ctx, key, "", time.Minute); err != nil || r.Outcome != dedup.Duplicate {
			t.Fatalf("Claim(%q) = %v, %v; want a duplicate (completed)", key, r.Outcome, err)
		}
	}
}

// TestDoBatchCopyTakesTheClaimOfACallNotStarted: with two groups at once,
// the copy of a key whose turn comes before the key's first call (behind a
// slow call of its own group) runs the work with the batch's claim, at
// once, and the first call is then its duplicate. Before, the copy waited
// (Config.InProgressWait) for a call that could not start before it.
func TestDoBatchCopyTakesTheClaimOfACallNotStarted(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(batchEpoch)
	mem := memstore.New(clock)
	e, err := dedup.NewEngine(dedup.Config{Store: mem, Clock: clock, Lease: time.Minute, Retention: time.Hour,
		InProgressWait: time.Minute, Scope: "s"})
	if err != nil {
		t.Fatal(err)
	}
	// Group g: slow, then k (the key's first call, which sends its
	// claim); group h: k's copy, whose turn comes while slow runs.
	b := calls("s", "slow", "k", "k")
	b[0].Group, b[1].Group, b[2].Group = "g", "g", "h"
	copyRan := make(chan struct{})
	var mu sync.Mutex
	var ran []int
	res := doBatch(e, ctx, dedup.Batch{Calls: b, Concurrency: 2}, func(ctx context.Context, i int) ([]byte, error) {
		mu.Lock()
		ran = append(ran, i)
		mu.Unlock()
		switch i {
		case 0:
			select {
			case <-copyRan:
			case <-time.After(10 * time.Second):
				t.Error("k's copy did not run while the first call of k waited behind slow")
			}
		case 2:
			if o, ok := dedup.OutcomeFromContext(ctx); !ok || o != dedup.Acquired {
				t.Error("the copy's work runs without the claim in its context")
			}
			close(copyRan)
			return []byte("charged by 2"), nil
		}
		return []byte("ok"), nil
	})
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(ran, []int{0, 2}) && !slices.Equal(ran, []int{2, 0}) {
		t.Fatalf("ran %v, want slow and k's copy only", ran)
	}
	if res[2].Err != nil || res[2].Outcome != dedup.Acquired {
		t.Fatalf("copy: %v %v, want acquired", res[2].Outcome, res[2].Err)
	}
	if res[1].Err != nil || res[1].Outcome != dedup.Duplicate || string(res[1].Result) != "charged by 2" {
		t.Fatalf("first call: %v %q %v, want the copy's duplicate", res[1].Outcome, res[1].Result, res[1].Err)
	}
	if r, err := mem.Claim(ctx, "s:k", "", time.Minute); err != nil || r.Outcome != dedup.Duplicate || string(r.Result) != "charged by 2" {
		t.Fatalf("Claim(s:k) = %v %q, %v; want completed with the copy's result", r.Outcome, r.Result, err)
	}
}
