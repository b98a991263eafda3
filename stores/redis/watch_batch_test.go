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
