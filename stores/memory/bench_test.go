package memory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// BenchmarkClaimComplete is the store's hot path: a Claim that acquires
// and its Complete, with nobody watching and no transaction. Run with
// -benchmem: allocations per op are the figure to keep.
//
//	go test -run '^$' -bench ClaimComplete -benchmem ./stores/memory/
func BenchmarkClaimComplete(b *testing.B) {
	const n = 1 << 14
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint("charge:ORDER-", i)
	}
	clock := fakeclock.New(epoch)
	store := memstore.New(clock)
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		if i%n == 0 {
			clock.Advance(2 * time.Minute) // every record of the last round has expired
		}
		res, err := store.Claim(ctx, keys[i%n], "", 30*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		if err := store.Complete(ctx, res.Claim, nil, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}
