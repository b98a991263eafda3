package dedup_test

import (
	"context"
	"errors"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// TestFailureAfterInWorkCompletionIsNoLostClaim: work that completed its
// own record (stores/postgres RunInTx: the effect and the completion
// committed, then MarkCompleted) and then fails or panics (a step after
// the transaction, a middleware between dedup and TxMiddleware) must not
// have the engine release the record and report claim_lost ("another
// consumer may have run the effect too", error level): the effect ran once
// and its record is completed by this very claim. (run released whenever
// the work failed, without looking at hc.Completed(): a Release round trip
// that could only fail, and a false claim_lost alarm.)
func TestFailureAfterInWorkCompletionIsNoLostClaim(t *testing.T) {
	for _, panics := range []bool{false, true} {
		name := map[bool]string{false: "error", true: "panic"}[panics]
		t.Run(name, func(t *testing.T) {
			clock := fakeclock.New(epoch)
			store := memstore.New(clock)
			obs := newDecisions()
			e, err := dedup.NewEngine(dedup.Config{Store: store, Clock: clock, Observer: obs})
			if err != nil {
				t.Fatal(err)
			}
			errAfter := errors.New("a step after the commit failed")
			func() {
				defer func() {
					if p := recover(); p != nil && !panics {
						t.Fatalf("unexpected panic: %v", p)
					}
				}()
				_, err = e.Do(context.Background(), dedup.Call{Scope: "s", Key: "k"}, func(ctx context.Context) ([]byte, error) {
					hc, ok := dedup.HeldClaimFromContext(ctx)
					if !ok {
						t.Fatal("no claim in the work's context")
					}
					hc.StopHeartbeat()
					if err := store.Complete(ctx, hc.Claim(), nil, hc.Retention()); err != nil {
						t.Fatal(err)
					}
					hc.MarkCompleted()
					if panics {
						panic(errAfter)
					}
					return nil, errAfter
				})
			}()
			if !panics && !errors.Is(err, errAfter) {
				t.Errorf("Do: %v, want the work's error", err)
			}
			for _, d := range obs.of(event.ClaimLost) {
				t.Errorf("claim_lost (op %q) for a record this claim completed: %v", d.Op, d.Err)
			}
			// The record is completed: a retry is a duplicate.
			res, err := e.Do(context.Background(), dedup.Call{Scope: "s", Key: "k"}, func(context.Context) ([]byte, error) { return nil, nil })
			if err != nil || res.Outcome != dedup.Duplicate {
				t.Errorf("retry: %v, %v; want Duplicate", res.Outcome, err)
			}
		})
	}
}
