package dedup_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// eventRecorder records the events of the engine's decisions.
type eventRecorder struct {
	mu     sync.Mutex
	events []event.Event
	inProg chan struct{} // closed at the first in_progress decision
	once   sync.Once
}

func newEventRecorder() *eventRecorder { return &eventRecorder{inProg: make(chan struct{})} }

func (o *eventRecorder) ObserveDecision(d dedup.Decision) {
	o.mu.Lock()
	o.events = append(o.events, d.Event)
	o.mu.Unlock()
	if d.Event == event.InProgress {
		o.once.Do(func() { close(o.inProg) })
	}
}

func (o *eventRecorder) ObserveStoreOp(string, time.Duration, error) {}

func (o *eventRecorder) count(e event.Event) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, got := range o.events {
		if got == e {
			n++
		}
	}
	return n
}

func newObservedBatchEngine(t *testing.T, store dedup.Store, clock dedup.Clock, obs dedup.Observer, shadow bool, wait time.Duration) *dedup.Engine {
	t.Helper()
	e, err := dedup.NewEngine(dedup.Config{Store: store, Clock: clock, Lease: time.Minute, Retention: time.Hour, CompleteBackoff: time.Millisecond,
		Observer: obs, Shadow: shadow, InProgressWait: wait, Scope: "cfg"})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestDoBatchStartByAtTheTurn: a call whose claim was won with the batch
// but whose turn comes at or after its StartBy does not run: its claim is
// released (a ReleaseBatch, no single Release) and it ends with
// ErrNotStarted, so a retry runs it.
func TestDoBatchStartByAtTheTurn(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(batchEpoch)
	mem := memstore.New(clock)
	cs := &countingStore{Store: mem, mem: mem}
	e := newBatchEngine(t, batchStore{cs}, clock)
	b := calls("s", "a", "b", "c")
	for i := range b {
		b[i].StartBy = batchEpoch.Add(10 * time.Second)
	}
	var ran []int
	res := doBatch(e, ctx, dedup.Batch{Calls: b}, func(ctx context.Context, i int) ([]byte, error) {
		ran = append(ran, i) // one call at a time (Concurrency 1)
		clock.Advance(6 * time.Second)
		return nil, nil
	})
	// a starts at 0s, b at 6s, c would start at 12s.
	if !slices.Equal(ran, []int{0, 1}) {
		t.Fatalf("ran %v, want [0 1]", ran)
	}
	if res[0].Err != nil || res[1].Err != nil || !errors.Is(res[2].Err, dedup.ErrNotStarted) {
		t.Fatalf("results %+v, want a and b done, c ErrNotStarted", res)
	}
	// a's completion goes as a ends, b's as b ends: one request, or two
	// when a's was still in flight.
	if cs.relBatches != 1 || cs.releases != 0 || cs.completeBatches < 1 || cs.completeBatches > 2 || cs.completes != 0 {
		t.Fatalf("%d release batches, %d single releases, %d complete batches, %d single completes; want 1, 0, 1 or 2, 0",
			cs.relBatches, cs.releases, cs.completeBatches, cs.completes)
	}
	if r, err := mem.Claim(ctx, "s:c", "", time.Minute); err != nil || r.Outcome != dedup.Acquired {
		t.Fatalf("Claim(s:c) = %v, %v; want acquired (released unworked)", r.Outcome, err)
	}
}

// TestDoBatchStartByBoundsACopysWait: a copy whose first call (another
// group's) still runs waits for it with Config.InProgressWait, but not
// past its StartBy: it ends in progress by then, though the wait's own
// bound is a minute away.
func TestDoBatchStartByBoundsACopysWait(t *testing.T) {
	clock := fakeclock.New(batchEpoch)
	obs := newEventRecorder()
	e := newObservedBatchEngine(t, memstore.New(clock), clock, obs, false, time.Minute)
	startBy := batchEpoch.Add(5 * time.Second)
	// g2's first call waits until the first call of k runs, so that k's
	// copy takes its turn while it does.
	b := calls("s", "k", "x", "k")
	b[0].Group, b[1].Group, b[2].Group = "g1", "g2", "g2"
	b[2].StartBy = startBy
	release := make(chan struct{})
	kRuns := make(chan struct{})
	done := make(chan []batchResult, 1)
	go func() {
		done <- doBatch(e, context.Background(), dedup.Batch{Calls: b, Concurrency: 2}, func(ctx context.Context, i int) ([]byte, error) {
			if i == 1 {
				<-kRuns
				return nil, nil
			}
			close(kRuns)
			<-release // the first call runs until the copy's wait has ended
			return []byte("ok"), nil
		})
	}()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clock.WaitForTimerAt(wctx, startBy); err != nil {
		t.Fatalf("the copy's wait is not bounded by its StartBy: %v", err)
	}
	clock.Advance(5 * time.Second)
	select {
	case <-obs.inProg:
	case <-time.After(10 * time.Second):
		t.Fatal("the copy's wait did not end at its StartBy within 10s")
	}
	close(release)
	res := <-done
	if res[0].Err != nil || res[1].Err != nil || !errors.Is(res[2].Err, dedup.ErrInProgress) {
		t.Fatalf("results %+v, want the first done and the copy ErrInProgress", res)
	}
}

// TestDoBatchKeyErrIsUnkeyed: a call with Call.KeyErr is decided in a
// batch as Engine.Do decides it: nothing claimed, key_missing (transport_key
// for ErrTransportKey) and KeyErr; in shadow mode would_reject and the
// work runs without a claim. A call without a Scope takes Config.Scope.
func TestDoBatchKeyErrIsUnkeyed(t *testing.T) {
	for _, shadow := range []bool{false, true} {
		ctx := context.Background()
		clock := fakeclock.New(batchEpoch)
		mem := memstore.New(clock)
		cs := &countingStore{Store: mem, mem: mem}
		obs := newEventRecorder()
		e := newObservedBatchEngine(t, batchStore{cs}, clock, obs, shadow, 0)
		noKey := &dedup.KeyError{Reason: "no order_id"}
		transport := dedup.ErrTransportKey
		b := []dedup.BatchCall{
			{Call: dedup.Call{Key: "a"}}, // Config.Scope
			{Call: dedup.Call{Key: "x", KeyErr: noKey}},
			{Call: dedup.Call{KeyErr: transport}},
		}
		var ran atomic.Int32
		res := doBatch(e, ctx, dedup.Batch{Calls: b}, func(ctx context.Context, i int) ([]byte, error) {
			ran.Add(1)
			return nil, nil
		})
		if !slices.Equal(cs.batchSizes, []int{1}) {
			t.Errorf("shadow %v: claim batch sizes %v, want [1] (a only)", shadow, cs.batchSizes)
		}
		if r, err := mem.Claim(ctx, "cfg:a", "", time.Minute); err != nil || r.Outcome != dedup.Duplicate {
			t.Errorf("shadow %v: Claim(cfg:a) = %v, %v; want duplicate (Config.Scope taken)", shadow, r.Outcome, err)
		}
		if shadow {
			if ran.Load() != 3 || res[1].Err != nil || res[2].Err != nil {
				t.Errorf("shadow: ran %d, results %+v; want 3 runs and no error", ran.Load(), res)
			}
			if n := obs.count(event.WouldReject); n != 2 {
				t.Errorf("shadow: %d would_reject, want 2", n)
			}
			continue
		}
		if ran.Load() != 1 || !errors.Is(res[1].Err, dedup.ErrNoKey) || !errors.Is(res[2].Err, dedup.ErrTransportKey) {
			t.Errorf("ran %d, results %+v; want 1 run, ErrNoKey, ErrTransportKey", ran.Load(), res)
		}
		if obs.count(event.KeyMissing) != 1 || obs.count(event.TransportKey) != 1 {
			t.Errorf("events %v, want one key_missing and one transport_key", obs.events)
		}
	}
}
