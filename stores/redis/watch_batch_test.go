package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// The batch paths run the same scripts: a completion or a release in a
// batch is announced like a single one, and wakes the key's watches.
func TestBatchCompletionsAndReleasesAreAnnounced(t *testing.T) {
	client := newClient(t)
	store := newStore(t, client, redis.Config{KeyPrefix: watchPrefix("watch-batch")})
	defer store.Close()
	ctx := context.Background()
	var wakes []<-chan struct{}
	var claims []dedup.Claim
	for _, key := range []string{"a", "b"} {
		res, err := store.Claim(ctx, key, "", time.Minute)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("claim %s: %v %v", key, res.Outcome, err)
		}
		wake, stop, err := store.WatchKey(ctx, key, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		recvWithin(t, "the wake of the subscription in place", wake)
		wakes, claims = append(wakes, wake), append(claims, res.Claim)
	}
	if errs := store.CompleteBatch(ctx, []dedup.CompleteRequest{{Claim: claims[0], Retention: time.Minute}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	recvWithin(t, "the wake of the batch completion", wakes[0])
	if errs := store.ReleaseBatch(ctx, claims[1:]); errs[0] != nil {
		t.Fatal(errs[0])
	}
	recvWithin(t, "the wake of the batch release", wakes[1])
}

// A completion written together with the handler's commands (RunInTx, one
// script built on Complete's) is announced like Complete's.
func TestTxCompletionIsAnnounced(t *testing.T) {
	client := newClient(t)
	store := newStore(t, client, redis.Config{KeyPrefix: watchPrefix("watch-tx")})
	defer store.Close()
	e, err := dedup.NewEngine(dedup.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	wake, stop, err := store.WatchKey(ctx, "tx:k", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	recvWithin(t, "the wake of the subscription in place", wake)
	res, err := e.Do(ctx, dedup.Call{Scope: "tx", Key: "k"}, func(ctx context.Context) ([]byte, error) {
		return store.RunInTx(ctx, func(context.Context) ([]byte, error) { return []byte("done"), nil })
	})
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("Do: %v %v", res.Outcome, err)
	}
	recvWithin(t, "the wake of the completion in the transaction's script", wake)
}
