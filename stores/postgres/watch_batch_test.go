package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// The batch paths run the same statements: with Notify, a completion or a
// release in a batch is announced like a single one, and wakes the key's
// watches.
func TestBatchCompletionsAndReleasesNotify(t *testing.T) {
	store := notifyStore(t)
	ctx := testCtx(t)
	var wakes []<-chan struct{}
	var claims []dedup.Claim
	for _, key := range []string{"a", "b"} {
		res, err := store.Claim(ctx, key, "", time.Minute)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("claim %s: %v %v", key, res.Outcome, err)
		}
		wake, stop, err := store.WatchKey(context.Background(), key, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		recvBounded(t, "the wake of the LISTEN in place", wake)
		wakes, claims = append(wakes, wake), append(claims, res.Claim)
	}
	if errs := store.CompleteBatch(ctx, []dedup.CompleteRequest{{Claim: claims[0], Retention: time.Minute}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	recvBounded(t, "the wake of the batch completion", wakes[0])
	if errs := store.ReleaseBatch(ctx, claims[1:]); errs[0] != nil {
		t.Fatal(errs[0])
	}
	recvBounded(t, "the wake of the batch release", wakes[1])
}

// A completion in the handler's transaction (RunInTx) notifies at its
// commit, like Complete.
func TestTxCompletionNotifies(t *testing.T) {
	store := notifyStore(t)
	e, err := dedup.NewEngine(dedup.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	wake, stop, err := store.WatchKey(ctx, "tx:k", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	recvBounded(t, "the wake of the LISTEN in place", wake)
	res, err := e.Do(ctx, dedup.Call{Scope: "tx", Key: "k"}, func(ctx context.Context) ([]byte, error) {
		return store.RunInTx(ctx, func(context.Context) ([]byte, error) { return []byte("done"), nil })
	})
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("Do: %v %v", res.Outcome, err)
	}
	recvBounded(t, "the wake of the completion at the transaction's commit", wake)
}
