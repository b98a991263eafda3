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

// cancelOnClaim cancels a context when the nth claim has been answered.
type cancelOnClaim struct {
	*decisions
	mu     sync.Mutex
	claims int
	n      int
	cancel context.CancelFunc
}

func (o *cancelOnClaim) ObserveStoreOp(op string, _ time.Duration, _ error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if op == "claim" {
		if o.claims++; o.claims == o.n {
			o.cancel()
		}
	}
}

// TestWaitEndedBeforeAnyPollKeepsTheClaimsRoundTrip: a copy whose
// InProgressWait ends before its first poll (its context ended) made one
// claim: its in_progress decision carries that claim's round trip. (It
// carried 0, the wait's own, which no claim had set.)
func TestWaitEndedBeforeAnyPollKeepsTheClaimsRoundTrip(t *testing.T) {
	clock := fakeclock.New(epoch)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	obs := &cancelOnClaim{decisions: newDecisions(), n: 2, cancel: cancel}
	e, err := dedup.NewEngine(dedup.Config{Store: memstore.New(clock), Clock: clock, Observer: obs,
		InProgressWait: time.Minute, DisableHeartbeat: true})
	if err != nil {
		t.Fatal(err)
	}
	call := dedup.Call{Scope: "s", Key: "k"}
	release := make(chan struct{})
	holder := holdKey(t, e, call, "done", nil, release)
	_, err = e.Do(ctx, call, func(context.Context) ([]byte, error) { return nil, errors.New("must not run") })
	if !errors.Is(err, dedup.ErrInProgress) {
		t.Fatalf("the waiting copy: %v, want ErrInProgress", err)
	}
	close(release)
	if err := recv(t, "the holder", holder); err != nil {
		t.Fatal(err)
	}
	got := obs.of(event.InProgress)
	if len(got) != 1 || got[0].Elapsed <= 0 {
		t.Fatalf("in_progress decisions %+v, want one with the claim's round trip as Elapsed", got)
	}
}
