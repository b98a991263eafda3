package dedup_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// lateInProgressStore answers the first claim InProgress only once its
// deadline has passed (the engine's timer has fired), and the next ones
// from the memory store.
type lateInProgressStore struct {
	dedup.Store
	fired     chan struct{} // closed by the engine's timer hook
	firstDone <-chan struct{}
	claims    int
	second    chan struct{} // closed when the second claim is sent
}

func (s *lateInProgressStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	s.claims++
	if s.claims == 1 {
		s.firstDone = ctx.Done() // arms the deadline's timer
		<-s.fired
		return dedup.ClaimResult{Outcome: dedup.InProgress}, nil
	}
	if s.claims == 2 {
		close(s.second)
	}
	return s.Store.Claim(ctx, key, fp, lease)
}

// TestClaimAfterATimedOutClaimGetsALiveWorkContext: a claim answered
// InProgress after its deadline fired, and the next claim of an
// InProgressWait won while the timer's goroutine had not yet ended the
// work's context: the work runs on a context that the late timer does not
// cancel. (It ran on the old one, cancelled under its feet.)
func TestClaimAfterATimedOutClaimGetsALiveWorkContext(t *testing.T) {
	s := &lateInProgressStore{Store: memstore.New(nil), fired: make(chan struct{}), second: make(chan struct{})}
	var once sync.Once
	dedup.SetTestHookOpTimedOut(func() {
		once.Do(func() {
			close(s.fired)
			<-s.second // the timer's goroutine is late: the next claim goes first
		})
	})
	t.Cleanup(func() { dedup.SetTestHookOpTimedOut(nil) })
	e, err := dedup.NewEngine(dedup.Config{Store: s, StoreTimeout: 20 * time.Millisecond,
		InProgressWait: 10 * time.Second, InProgressPoll: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var workErr error
	res, err := e.Do(context.Background(), dedup.Call{Scope: "s", Key: "k"}, func(work context.Context) ([]byte, error) {
		recv(t, "the timed-out claim's context to end", s.firstDone)
		workErr = context.Cause(work)
		return nil, nil
	})
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("Do: %v, %v; want Acquired", res.Outcome, err)
	}
	if workErr != nil {
		t.Errorf("the work's context was ended (%v) by the deadline of an earlier claim", workErr)
	}
}
