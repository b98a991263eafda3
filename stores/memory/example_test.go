package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// The store contract on one key: acquired, in progress while held, a
// duplicate with its result once completed, and free again when the
// retention ends. With nil instead of a fake clock it uses the wall clock.
func ExampleNew() {
	ctx := context.Background()
	clock := fakeclock.New(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	store, err := memory.New(context.Background(), memory.Config{Clock: clock})
	if err != nil {
		panic(err)
	}
	show := func(res dedup.ClaimResult, err error) dedup.ClaimResult {
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s %q\n", res.Outcome, res.Result)
		return res
	}
	const key = "charge-orders:ORDER-003"
	first := show(store.Claim(ctx, key, "", 30*time.Second))
	show(store.Claim(ctx, key, "", 30*time.Second))
	if err := store.Complete(ctx, first.Claim, []byte("receipt-7"), 24*time.Hour); err != nil {
		panic(err)
	}
	show(store.Claim(ctx, key, "", 30*time.Second))
	clock.Advance(24 * time.Hour)
	show(store.Claim(ctx, key, "", 30*time.Second))
	// Output:
	// acquired ""
	// in_progress ""
	// duplicate "receipt-7"
	// acquired ""
}
