package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/poll"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// countingStore counts the requests the engine sends to a store, single
// and batch; without batch it hides the store's batch capability.
type countingStore struct {
	dedup.Store
	mem                                       *memory.Store
	mu                                        sync.Mutex
	claims, completes, releases, extends      int
	claimBatches, completeBatches, relBatches int
	batchSizes                                []int
}

func (s *countingStore) count(p *int) {
	s.mu.Lock()
	*p++
	s.mu.Unlock()
}

func (s *countingStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	s.count(&s.claims)
	return s.Store.Claim(ctx, key, fp, lease)
}

func (s *countingStore) Complete(ctx context.Context, c dedup.Claim, r []byte, ret time.Duration) error {
	s.count(&s.completes)
	return s.Store.Complete(ctx, c, r, ret)
}

func (s *countingStore) Release(ctx context.Context, c dedup.Claim) error {
	s.count(&s.releases)
	return s.Store.Release(ctx, c)
}

func (s *countingStore) Extend(ctx context.Context, c dedup.Claim, lease time.Duration) error {
	s.count(&s.extends)
	return s.Store.Extend(ctx, c, lease)
}

// batchStore is countingStore with the batch capability.
type batchStore struct{ *countingStore }

func (s batchStore) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.ClaimResult, []error) {
	s.count(&s.claimBatches)
	s.mu.Lock()
	s.batchSizes = append(s.batchSizes, len(reqs))
	s.mu.Unlock()
	return s.mem.ClaimBatch(ctx, reqs)
}

func (s batchStore) CompleteBatch(ctx context.Context, reqs []dedup.CompleteRequest) []error {
	s.count(&s.completeBatches)
	return s.mem.CompleteBatch(ctx, reqs)
}

func (s batchStore) ReleaseBatch(ctx context.Context, claims []dedup.Claim) []error {
	s.count(&s.relBatches)
	return s.mem.ReleaseBatch(ctx, claims)
}

var batchEpoch = time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)

func newBatchEngine(t *testing.T, store dedup.Store, clock dedup.Clock) *dedup.Engine {
	t.Helper()
	e, err := dedup.NewEngine(dedup.Config{Store: store, Clock: clock, Lease: time.Minute, Retention: time.Hour, CompleteBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func calls(scope string, keys ...string) []dedup.BatchCall {
	out := make([]dedup.BatchCall, len(keys))
	for i, k := range keys {
		out[i] = dedup.BatchCall{Call: dedup.Call{Scope: scope, Key: k}}
	}
	return out
}

// TestDoBatchOutcomes: every outcome of Do, in one batch: one ClaimBatch,
// one CompleteBatch (one call ran), one ReleaseBatch (one failed), no single
// request; a repeated key
// runs once and its copy is a duplicate with the first's result; the
// empty key is refused and nothing is claimed for it.
func TestDoBatchOutcomes(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(batchEpoch)
	mem := memstore.New(clock)
	cs := &countingStore{Store: mem, mem: mem}
	e := newBatchEngine(t, batchStore{cs}, clock)

	// A completed key, a held key and one completed with a fingerprint.
	if _, err := e.Do(ctx, dedup.Call{Scope: "s", Key: "dup"}, func(context.Context) ([]byte, error) { return []byte("old"), nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := mem.Claim(ctx, "s:held", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Do(ctx, dedup.Call{Scope: "s", Key: "fp", Fingerprint: "A"}, func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	*cs = countingStore{Store: mem, mem: mem}

	b := calls("s", "a", "b", "dup", "held", "fp", " ", "a")
	b[4].Fingerprint = "B"
	failB := errors.New("b fails")
	var ran []int
	var mu sync.Mutex
	res := doBatch(e, ctx, dedup.Batch{Calls: b}, func(ctx context.Context, i int) ([]byte, error) {
		mu.Lock()
		ran = append(ran, i)
		mu.Unlock()
		if o, ok := dedup.OutcomeFromContext(ctx); !ok || o != dedup.Acquired {
			t.Errorf("call %d: the work's context has no acquired claim", i)
		}
		if i == 1 {
			return nil, failB
		}
		return []byte(fmt.Sprint("r", i)), nil
	})
	if !slices.Equal(ran, []int{0, 1}) {
		t.Fatalf("ran %v, want [0 1]", ran)
	}
	check := func(i int, want dedup.Outcome, result string, wantErr error) {
		t.Helper()
		r := res[i]
		if wantErr != nil {
			if !errors.Is(r.Err, wantErr) {
				t.Fatalf("call %d: err %v, want %v", i, r.Err, wantErr)
			}
			return
		}
		if r.Err != nil || r.Outcome != want || string(r.Result) != result {
			t.Fatalf("call %d = %v %q %v, want %v %q", i, r.Outcome, r.Result, r.Err, want, result)
		}
	}
	check(0, dedup.Acquired, "r0", nil)
	check(1, 0, "", failB)
	check(2, dedup.Duplicate, "old", nil)
	check(3, 0, "", dedup.ErrInProgress)
	check(4, 0, "", dedup.ErrKeyReuse)
	check(5, 0, "", dedup.ErrNoKey)
	check(6, dedup.Duplicate, "r0", nil)
	if cs.claims+cs.completes+cs.releases != 0 {
		t.Fatalf("single requests: %d claims, %d completes, %d releases; want none", cs.claims, cs.completes, cs.releases)
	}
	// One record completed (a) and one released (b): each in a request of
	// its own kind, sent as the call ended.
	if cs.claimBatches != 1 || cs.completeBatches != 1 || cs.relBatches != 1 {
		t.Fatalf("batches: %d claim, %d complete, %d release; want 1 each", cs.claimBatches, cs.completeBatches, cs.relBatches)
	}
	if !slices.Equal(cs.batchSizes, []int{5}) { // a, b, dup, held, fp: not the empty key nor the copy
		t.Fatalf("claim batch sizes %v, want [5]", cs.batchSizes)
	}
	// a completed, b released (claimable again), nothing under the blank key.
	for key, want := range map[string]dedup.Outcome{"s:a": dedup.Duplicate, "s:b": dedup.Acquired, "s: ": dedup.Acquired} {
		if r, err := mem.Claim(ctx, key, "", time.Minute); err != nil || r.Outcome != want {
			t.Fatalf("Claim(%q) = %v, %v; want %v", key, r.Outcome, err, want)
		}
	}
}

// TestDoBatchWithoutBatchStore: a store without the capability gets one
// request per record and the same outcomes.
func TestDoBatchWithoutBatchStore(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(batchEpoch)
	mem := memstore.New(clock)
	cs := &countingStore{Store: mem, mem: mem}
	e := newBatchEngine(t, cs, clock)
	res := doBatch(e, ctx, dedup.Batch{Calls: calls("s", "a", "b", "a")}, func(ctx context.Context, i int) ([]byte, error) {
		if i == 1 {
			return nil, errors.New("fails")
		}
		return []byte("ok"), nil
	})
	if res[0].Outcome != dedup.Acquired || res[1].Err == nil || res[2].Outcome != dedup.Duplicate || string(res[2].Result) != "ok" {
		t.Fatalf("results %+v", res)
	}
	if cs.claims != 2 || cs.completes != 1 || cs.releases != 1 {
		t.Fatalf("%d claims, %d completes, %d releases; want 2, 1, 1", cs.claims, cs.completes, cs.releases)
	}
}

// TestDoBatchGroupStops: after a call of a group fails, the group's later
// calls do not start: their claims are released, in ReleaseBatch requests
// (never one by one); calls of other groups go on.
func TestDoBatchGroupStops(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(batchEpoch)
	mem := memstore.New(clock)
	cs := &countingStore{Store: mem, mem: mem}
	e := newBatchEngine(t, batchStore{cs}, clock)
	b := calls("s", "x", "y", "z", "other")
	b[0].Group, b[1].Group, b[2].Group, b[3].Group = "g", "g", "g", "h"
	var ran atomic.Int32
	res := doBatch(e, ctx, dedup.Batch{Calls: b}, func(ctx context.Context, i int) ([]byte, error) {
		ran.Add(1)
		if i == 0 {
			return nil, errors.New("x fails")
		}
		return nil, nil
	})
	if ran.Load() != 2 {
		t.Fatalf("ran %d calls, want 2 (x and other)", ran.Load())
	}
	if !errors.Is(res[1].Err, dedup.ErrNotStarted) || !errors.Is(res[2].Err, dedup.ErrNotStarted) || res[3].Err != nil {
		t.Fatalf("results %+v", res)
	}
	// x's release goes as x ends, y's and z's as the group stops: in one
	// request or two, depending on whether x's was still in flight.
	if cs.relBatches < 1 || cs.relBatches > 2 || cs.releases != 0 {
		t.Fatalf("%d release batches, %d single releases; want 1 or 2, 0", cs.relBatches, cs.releases)
	}
	for _, key := range []string{"s:x", "s:y", "s:z"} {
		if r, err := mem.Claim(ctx, key, "", time.Minute); err != nil || r.Outcome != dedup.Acquired {
			t.Fatalf("Claim(%q) = %v, %v; want acquired", key, r.Outcome, err)
		}
	}
}

// TestDoBatchCopyOfFailedCall: a copy of a call that failed does not run:
// ErrInProgress, never two runs of one key in a batch.
func TestDoBatchCopyOfFailedCall(t *testing.T) {
	clock := fakeclock.New(batchEpoch)
	e := newBatchEngine(t, memstore.New(clock), clock)
	var ran atomic.Int32
	res := doBatch(e, context.Background(), dedup.Batch{Calls: calls("s", "k", "k", "k")}, func(ctx context.Context, i int) ([]byte, error) {
		ran.Add(1)
		return nil, errors.New("fails")
	})
	if ran.Load() != 1 || !errors.Is(res[1].Err, dedup.ErrInProgress) || !errors.Is(res[2].Err, dedup.ErrInProgress) {
		t.Fatalf("ran %d, results %+v", ran.Load(), res)
	}
}

// TestDoBatchPanic: a panic releases the call's claim, stops the batch
// (the calls left are released, not started), and goes on from DoBatch.
func TestDoBatchPanic(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(batchEpoch)
	mem := memstore.New(clock)
	e := newBatchEngine(t, mem, clock)
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Fatalf("recovered %v, want boom", p)
			}
		}()
		e.DoBatch(ctx, dedup.Batch{Calls: calls("s", "a", "b")}, func(ctx context.Context, i int) ([]byte, error) {
			if i == 0 {
				panic("boom")
			}
			t.Error("call 1 ran after a panic")
			return nil, nil
		})
		t.Fatal("DoBatch returned")
	}()
	for _, key := range []string{"s:a", "s:b"} {
		if r, err := mem.Claim(ctx, key, "", time.Minute); err != nil || r.Outcome != dedup.Acquired {
			t.Fatalf("Claim(%q) = %v, %v; want acquired", key, r.Outcome, err)
		}
	}
}

// TestDoBatchEmpty: an empty batch sends nothing.
func TestDoBatchEmpty(t *testing.T) {
	clock := fakeclock.New(batchEpoch)
	mem := memstore.New(clock)
	cs := &countingStore{Store: mem, mem: mem}
	e := newBatchEngine(t, batchStore{cs}, clock)
	if res := doBatch(e, context.Background(), dedup.Batch{}, nil); len(res) != 0 || cs.claimBatches != 0 {
		t.Fatalf("%d results, %d claim batches", len(res), cs.claimBatches)
	}
}

// TestDoBatchDeadlineLeaseNeedsNoHeartbeat: claims whose lease ends at the
// calls' Deadline are never extended, however long the batch's earlier
// calls take; without a Deadline the claims waiting for their turn are.
func TestDoBatchDeadlineLeaseNeedsNoHeartbeat(t *testing.T) {
	for _, withDeadline := range []bool{true, false} {
		t.Run(fmt.Sprint("deadline=", withDeadline), func(t *testing.T) {
			clock := fakeclock.New(batchEpoch)
			mem := memstore.New(clock)
			cs := &countingStore{Store: mem, mem: mem}
			e, err := dedup.NewEngine(dedup.Config{Store: batchStore{cs}, Clock: clock, Lease: 30 * time.Second, Heartbeat: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			b := calls("s", "a", "b")
			if withDeadline {
				for i := range b {
					b[i].Deadline = batchEpoch.Add(20 * time.Second)
				}
			}
			res := doBatch(e, context.Background(), dedup.Batch{Calls: b}, func(ctx context.Context, i int) ([]byte, error) {
				if i == 0 {
					// b's claim waits while a runs past a heartbeat.
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					at := batchEpoch.Add(5 * time.Second) // the heartbeat
					if withDeadline {
						at = batchEpoch.Add(19 * time.Second) // the deadline less its margin
					}
					if err := clock.WaitForTimerAt(ctx, at); err != nil {
						t.Errorf("no timer at %v: %v", at, err)
					}
					clock.Advance(6 * time.Second)
					if !withDeadline {
						poll.Wait(t, time.Minute, "the lease keeper", func() bool {
							cs.mu.Lock()
							defer cs.mu.Unlock()
							return cs.extends >= 2 // a's and b's
						})
					}
				}
				return nil, nil
			})
			for i, r := range res {
				if r.Err != nil || r.Outcome != dedup.Acquired {
					t.Fatalf("call %d: %+v", i, r)
				}
			}
			cs.mu.Lock()
			defer cs.mu.Unlock()
			if withDeadline && cs.extends != 0 {
				t.Fatalf("%d extensions of leases that end at the Deadline", cs.extends)
			}
			if !withDeadline && cs.extends == 0 {
				t.Fatal("no extension of the claims waiting for their turn")
			}
		})
	}
}

// batchResult is one call's answer from DoBatch, zipped for the checks.
type batchResult struct {
	dedup.ClaimResult
	Err error
}

// doBatch is e.DoBatch with its two slices zipped into one.
func doBatch(e *dedup.Engine, ctx context.Context, b dedup.Batch, fn func(ctx context.Context, i int) ([]byte, error)) []batchResult {
	res, errs := e.DoBatch(ctx, b, fn)
	if len(res) != len(b.Calls) || len(errs) != len(b.Calls) {
		panic(fmt.Sprintf("DoBatch answered %d results and %d errors for %d calls", len(res), len(errs), len(b.Calls)))
	}
	out := make([]batchResult, len(res))
	for i := range res {
		out[i] = batchResult{ClaimResult: res[i], Err: errs[i]}
	}
	return out
}
