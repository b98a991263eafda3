package admin_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// A scoped key is the escaped scope, ":" and the business key; the scope
// prefix lists one scope and no other.
func ExampleScopedKey() {
	fmt.Println(admin.ScopedKey("charge-orders", "ORDER-003"))
	fmt.Println(admin.ScopedKey("a:b", "c"), admin.ScopedKey("a", "b:c")) // never the same record
	fmt.Println(admin.ScopePrefix("charge-orders"))
	// Output:
	// charge-orders:ORDER-003
	// a%3Ab:c a:b:c
	// charge-orders:
}

// An operator looks at a scope's records, inspects one and evicts it so
// that the next delivery runs the handler again (what cmd/dedupctl does).
// Every store of this module implements admin.Interface; the memory store
// on a fake clock keeps this example exact.
func ExampleInterface() {
	ctx := context.Background()
	clock := fakeclock.New(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	store, err := memory.New(context.Background(), memory.Config{Clock: clock})
	if err != nil {
		panic(err)
	}
	for _, id := range []string{"ORDER-001", "ORDER-003"} {
		res, _ := store.Claim(ctx, admin.ScopedKey("charge-orders", id), "", 30*time.Second)
		_ = store.Complete(ctx, res.Claim, []byte("receipt"), 24*time.Hour)
	}
	_, _ = store.Claim(ctx, admin.ScopedKey("send-receipt", "ORDER-001"), "", 30*time.Second)
	clock.Advance(time.Hour)

	var ops admin.Interface = store
	records, next, err := ops.List(ctx, admin.ScopePrefix("charge-orders"), "", admin.MaxListLimit)
	if err != nil {
		panic(err)
	}
	for _, r := range records {
		fmt.Printf("%s %s, %v left, result %d B\n", r.Key, r.State, r.Remaining, r.ResultSize)
	}
	fmt.Printf("more: %v\n", next != "")

	evicted, _ := ops.Evict(ctx, admin.ScopedKey("charge-orders", "ORDER-003"))
	_, err = ops.Inspect(ctx, admin.ScopedKey("charge-orders", "ORDER-003"))
	fmt.Println("evicted:", evicted, "then not found:", errors.Is(err, admin.ErrNotFound))
	// Output:
	// charge-orders:ORDER-001 completed, 23h0m0s left, result 7 B
	// charge-orders:ORDER-003 completed, 23h0m0s left, result 7 B
	// more: false
	// evicted: true then not found: true
}
