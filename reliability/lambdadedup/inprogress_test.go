package lambdadedup_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
)

// claimGate closes met once want claims were sent.
type claimGate struct {
	mu     sync.Mutex
	claims int
	want   int
	met    chan struct{}
}

func (g *claimGate) ObserveDecision(dedup.Decision) {}
func (g *claimGate) ObserveStoreOp(op string, _ time.Duration, _ error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if op == "claim" {
		if g.claims++; g.claims == g.want {
			close(g.met)
		}
	}
}

// Two copies of one order in one batch, run at once: the copy that loses
// the claim is a batch item failure (back after the visibility timeout),
// or, with Dedup.InProgressWait, waits for the other and succeeds as a
// duplicate. The handler runs once either way.
func TestInProgressWaitInABatch(t *testing.T) {
	for _, wait := range []time.Duration{0, time.Minute} {
		gate := &claimGate{want: 2, met: make(chan struct{})}
		charges := 0
		var mu sync.Mutex
		h := newHandler(t, lambdadedup.Config{Concurrency: 2,
			Dedup: dedup.Config{Observer: gate, InProgressWait: wait, InProgressPoll: 10 * time.Millisecond}},
			func(*message.Message) error {
				select { // the other copy's claim finds this one in progress
				case <-gate.met:
				case <-time.After(time.Minute):
					return errors.New("waited a minute for the other copy's claim")
				}
				mu.Lock()
				charges++
				mu.Unlock()
				return nil
			})
		failed := invoke(t, context.Background(), h, record("m1", order("ORDER-003")), record("m2", order("ORDER-003")))
		switch {
		case charges != 1:
			t.Errorf("wait %v: %d charges, want 1", wait, charges)
		case wait == 0 && len(failed) != 1:
			t.Errorf("without a wait: failures %v, want the copy that found the key in progress", failed)
		case wait > 0 && !slices.Equal(failed, []string(nil)):
			t.Errorf("with InProgressWait: failures %v, want none", failed)
		}
	}
}
