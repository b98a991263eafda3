package dedup_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// panickingFinishStore is the memory store whose Complete or Release
// (op) panics once, before touching the record (a store bug).
type panickingFinishStore struct {
	*memory.Store
	op       string
	panicked atomic.Bool
}

func (s *panickingFinishStore) Complete(ctx context.Context, c dedup.Claim, r []byte, ret time.Duration) error {
	if s.op == "complete" && !s.panicked.Swap(true) {
		panic("store: complete")
	}
	return s.Store.Complete(ctx, c, r, ret)
}

func (s *panickingFinishStore) Release(ctx context.Context, c dedup.Claim) error {
	if s.op == "release" && !s.panicked.Swap(true) {
		panic("store: release")
	}
	return s.Store.Release(ctx, c)
}

// TestPanicWhileFinishingStopsTheHeartbeat: when the Store's Complete or
// Release panics, the panic goes on out of Do (a Watermill router's
// Recoverer then keeps the process alive), but the lease keeper must stop.
// (complete and release stopped it only after the store operation
// returned, so a panic there left the heartbeat extending the lease for as
// long as the process lived: the key stayed in_progress for good and every
// redelivered copy got ErrInProgress.) (A panicking Observer told of
// the operation leaves the timer until the next beat only: that Extend
// finds the record completed or released and the keeper gives up.)
func TestPanicWhileFinishingStopsTheHeartbeat(t *testing.T) {
	for _, op := range []string{"complete", "release"} {
		t.Run(op, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			const lease, heartbeat = 30 * time.Second, 10 * time.Second
			clock := fakeclock.New(epoch)
			store := &panickingFinishStore{Store: memstore.New(clock), op: op}
			e, err := dedup.NewEngine(dedup.Config{Store: store, Clock: clock, Lease: lease, Heartbeat: heartbeat})
			if err != nil {
				t.Fatal(err)
			}
			call := dedup.Call{Scope: "s", Key: "k"}
			func() {
				defer func() {
					if p := recover(); p == nil {
						t.Fatal("Do did not pass the panic on")
					}
				}()
				_, _ = e.Do(context.Background(), call, func(context.Context) ([]byte, error) {
					if store.op == "release" {
						return nil, errNetwork // the work fails: the claim is released
					}
					return nil, nil
				})
			}()
			if n := clock.Timers(); n != 0 {
				t.Errorf("%d timer(s) still pending after Do ended with a panic: the heartbeat goes on", n)
			}
			// Ten leases pass, a heartbeat interval at a time; a heartbeat
			// left running extends the lease at each step (waited for: its
			// next timer is armed once the extension returned).
			for i := 0; i < 10*int(lease/heartbeat); i++ {
				beating := clock.Timers() > 0
				next := clock.Now().Add(2 * heartbeat)
				clock.Advance(heartbeat)
				if beating {
					if err := clock.WaitForTimerAt(ctx, next); err != nil {
						t.Fatalf("heartbeat %d: %v", i, err)
					}
				}
			}
			res, err := e.Do(context.Background(), call, func(context.Context) ([]byte, error) { return nil, nil })
			if err != nil || res.Outcome != dedup.Acquired {
				t.Errorf("a copy ten leases later: %v, %v; want Acquired (the first claim's lease ended nine leases ago)", res.Outcome, err)
			}
		})
	}
}
