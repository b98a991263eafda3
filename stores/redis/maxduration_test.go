package redis_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// TestMaxRetentionCompletes: the longest time.Duration is a valid retention
// (dedup.Config accepts it, the store refuses only <= 0); rounding it up to
// whole milliseconds must not overflow into a negative PX, which Redis
// refuses, leaving the record in progress after the effect.
func TestMaxRetentionCompletes(t *testing.T) {
	ctx := context.Background()
	store := newStore(t, newClient(t), redis.Config{})
	key := uniqueKey("max-retention")
	res, err := store.Claim(ctx, key, "", time.Minute)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("Claim: %v %v", res.Outcome, err)
	}
	if err := store.Complete(ctx, res.Claim, nil, time.Duration(math.MaxInt64)); err != nil {
		t.Fatalf("Complete with retention MaxInt64: %v", err)
	}
	if res, err := store.Claim(ctx, key, "", time.Minute); err != nil || res.Outcome != dedup.Duplicate {
		t.Fatalf("Claim after Complete: %v %v, want duplicate", res.Outcome, err)
	}
}
