package memory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

func TestMemoryStoreSweepsExpiredRecords(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(epoch)
	store := memstore.New(clock)
	for i := range 5000 {
		res, err := store.Claim(ctx, fmt.Sprint("old-", i), "", time.Second)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("claim %d: %v %v", i, res.Outcome, err)
		}
	}
	if n := store.Len(); n != 5000 {
		t.Fatalf("Len = %d, want 5000", n)
	}
	clock.Advance(2 * time.Second)
	if n := store.Len(); n != 0 {
		t.Fatalf("Len after expiry = %d, want 0", n)
	}
	// New claims sweep old records without any goroutine: after enough
	// claims the map holds only the live records.
	for i := range 3 * 1024 {
		if _, err := store.Claim(ctx, fmt.Sprint("new-", i), "", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if n := memory.Size(store); n != 3*1024 {
		t.Fatalf("records held = %d, want only the %d live ones", n, 3*1024)
	}
}

// New has every store's shape; no Config is refused, the zero one included,
// and Config.Clock decides expiry.
func TestNewTakesConfig(t *testing.T) {
	ctx := context.Background()
	store, err := memory.New(ctx, memory.Config{})
	if err != nil || store == nil {
		t.Fatalf("New(zero Config) = %v, %v; want a store", store, err)
	}
	if res, err := store.Claim(ctx, "k", "", time.Minute); err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("claim on the wall clock: %v %v", res.Outcome, err)
	}
	clock := fakeclock.New(epoch)
	store, err = memory.New(ctx, memory.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Claim(ctx, "k", "", time.Second); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if res, err := store.Claim(ctx, "k", "", time.Second); err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("claim after the lease on Config.Clock: %v %v, want acquired", res.Outcome, err)
	}
}
