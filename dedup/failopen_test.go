package dedup_test

import (
	"context"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// downStore is a store that cannot be reached for Claim.
type downStore struct{ dedup.Store }

func (downStore) Claim(context.Context, string, string, time.Duration) (dedup.ClaimResult, error) {
	return dedup.ClaimResult{}, errNetwork
}

// TestFailOpenRunHidesAnEnclosingClaim: a call that Config.FailOpen runs
// without a claim (its store is down) inside the work of another call that
// holds a claim must not see that other call's claim: OutcomeFromContext
// documents (0, false) for a fail-open run, and stores/postgres RunInTx
// would otherwise complete the enclosing call's record (another key) in
// the inner run's transaction. The Shadow branch of claimFailed already
// hides it with an unclaimed-run mark; the FailOpen branch does not.
func TestFailOpenRunHidesAnEnclosingClaim(t *testing.T) {
	clock := fakeclock.New(epoch)
	outer, err := dedup.NewEngine(dedup.Config{Store: memstore.New(clock), Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := dedup.NewEngine(dedup.Config{Store: downStore{memstore.New(clock)}, Clock: clock, FailOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	var got dedup.Outcome
	var ok, ran bool
	_, err = outer.Do(context.Background(), dedup.Call{Scope: "outer", Key: "A"}, func(ctx context.Context) ([]byte, error) {
		if o, acq := dedup.OutcomeFromContext(ctx); o != dedup.Acquired || !acq {
			t.Fatalf("outer work: OutcomeFromContext = %v, %v; want Acquired, true", o, acq)
		}
		_, err := inner.Do(ctx, dedup.Call{Scope: "inner", Key: "B"}, func(ctx context.Context) ([]byte, error) {
			ran = true
			got, ok = dedup.OutcomeFromContext(ctx)
			return nil, nil
		})
		return nil, err
	})
	if err != nil || !ran {
		t.Fatalf("Do: %v (inner ran: %v)", err, ran)
	}
	if ok || got != 0 {
		t.Errorf("fail-open run: OutcomeFromContext = %v, %v; want 0, false (it sees the enclosing call's claim of another key)", got, ok)
	}
}
