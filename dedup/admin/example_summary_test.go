package admin_test

import (
	"context"
	"fmt"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// A summary of one scope of an in-process memory store (dedupctl summary
// does the same for Redis, DynamoDB and PostgreSQL): ORDER-001 completed,
// ORDER-002 held by a running consumer, ORDER-003 by one that crashed, whose
// lease has since ended.
func ExampleSummarize() {
	ctx := context.Background()
	clock := fakeclock.New(time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC))
	store, err := memory.New(context.Background(), memory.Config{Clock: clock})
	if err != nil {
		panic(err)
	}
	claim := func(key string, lease time.Duration) dedup.Claim {
		res, err := store.Claim(ctx, admin.ScopedKey("charge-orders", key), "", lease)
		if err != nil {
			panic(err)
		}
		return res.Claim
	}
	if err := store.Complete(ctx, claim("ORDER-001", 30*time.Second), nil, 24*time.Hour); err != nil {
		panic(err)
	}
	claim("ORDER-003", 30*time.Second)
	clock.Advance(10 * time.Second)
	claim("ORDER-002", time.Hour)
	clock.Advance(time.Minute)

	sum, err := admin.Summarize(ctx, store, admin.ScopePrefix("charge-orders"), admin.SummaryOptions{})
	if err != nil {
		panic(err)
	}
	for _, s := range sum.Scopes {
		fmt.Printf("%s: %d in progress, %d completed, %d abandoned\n", s.Scope, s.InProgress, s.Completed, s.Abandoned)
		fmt.Printf("oldest in progress: %s, claimed %s ago\n", s.OldestInProgress.Key, clock.Now().Sub(s.OldestInProgress.ClaimedAt))
		fmt.Printf("oldest abandoned: %s, lease ended %s ago\n", s.OldestAbandoned.Key, -s.OldestAbandoned.Remaining)
	}
	// Output:
	// charge-orders: 1 in progress, 1 completed, 1 abandoned
	// oldest in progress: charge-orders:ORDER-002, claimed 1m0s ago
	// oldest abandoned: charge-orders:ORDER-003, lease ended 40s ago
}
