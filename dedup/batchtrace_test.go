package dedup_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// batchTracer records, per call key, the decisions, store operations and
// end of each traced call.
type batchTracer struct {
	mu    sync.Mutex
	calls map[string]*batchTrace
}

type batchTrace struct {
	t      *batchTracer
	events []event.Event
	ops    []string
	ends   int
	res    dedup.ClaimResult
	err    error
}

func (tr *batchTracer) StartCall(ctx context.Context, call dedup.Call) (context.Context, dedup.CallTrace) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	c := &batchTrace{t: tr}
	tr.calls[call.Key] = c
	return ctx, c
}

func (c *batchTrace) ObserveDecision(d dedup.Decision) {
	c.t.mu.Lock()
	c.events = append(c.events, d.Event)
	c.t.mu.Unlock()
}

func (c *batchTrace) ObserveStoreOp(op string, _ time.Duration, _ error) {
	c.t.mu.Lock()
	c.ops = append(c.ops, op)
	c.t.mu.Unlock()
}

func (c *batchTrace) EndCall(res dedup.ClaimResult, err error) {
	c.t.mu.Lock()
	c.ends++
	c.res, c.err = res, err
	c.t.mu.Unlock()
}

// TestDoBatchTracesEachCall: with Config.Tracer every call of a batch is a
// call of its own: started, given its decisions and its record's store
// operations, and ended once with its result.
func TestDoBatchTracesEachCall(t *testing.T) {
	clock := fakeclock.New(batchEpoch)
	tr := &batchTracer{calls: map[string]*batchTrace{}}
	e, err := dedup.NewEngine(dedup.Config{Store: memstore.New(clock), Clock: clock, Tracer: tr})
	if err != nil {
		t.Fatal(err)
	}
	failed := errors.New("fails")
	e.DoBatch(context.Background(), dedup.Batch{Calls: calls("s", "ok", "bad")}, func(ctx context.Context, i int) ([]byte, error) {
		if i == 1 {
			return nil, failed
		}
		return []byte("r"), nil
	})
	ok, bad := tr.calls["ok"], tr.calls["bad"]
	if ok == nil || bad == nil {
		t.Fatalf("traced calls %v, want ok and bad", tr.calls)
	}
	want := map[*batchTrace][]event.Event{ok: {event.ClaimWon, event.Completed}, bad: {event.ClaimWon, event.Released}}
	wantOps := map[*batchTrace][]string{ok: {"claim", "complete"}, bad: {"claim", "release"}}
	for c, events := range want {
		if c.ends != 1 || len(c.events) != 2 || c.events[0] != events[0] || c.events[1] != events[1] {
			t.Fatalf("trace: %d ends, events %v; want 1, %v", c.ends, c.events, events)
		}
		if len(c.ops) != 2 || c.ops[0] != wantOps[c][0] || c.ops[1] != wantOps[c][1] {
			t.Fatalf("trace: store ops %v, want %v", c.ops, wantOps[c])
		}
	}
	if ok.res.Outcome != dedup.Acquired || string(ok.res.Result) != "r" || !errors.Is(bad.err, failed) {
		t.Fatalf("ends: %+v %v / %v", ok.res, ok.err, bad.err)
	}
}
