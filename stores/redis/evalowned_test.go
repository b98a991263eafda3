package redis_test

import (
	"context"
	"strconv"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// TestClaimCompleteAllocations bounds the allocations of a new message's
// two commands (Claim, then Complete of its token-checking script): the
// store pools both commands and their arguments. With go-redis'
// Script.Run for the script it was 17 per Claim+Complete; the store's own
// runner makes 11. The bound leaves room for the race detector, under
// which sync.Pool drops a quarter of what is put back.
func TestClaimCompleteAllocations(t *testing.T) {
	withAndWithoutAutoPipeline(t, func(t *testing.T, _ *goredis.Client, store *redis.Store) {
		op := claimComplete(store)
		boundAllocs(t, "Claim+Complete of a fresh key", 14, func(key string) {
			if err := op(context.Background(), key); err != nil {
				t.Fatal(err)
			}
		})
	})
}

// boundAllocs fails t when one call of do, on a key not used before,
// allocates more than bound times on average (testing.AllocsPerRun over
// 500 calls, after 50 that warm the pools and the connection).
func boundAllocs(t *testing.T, what string, bound float64, do func(key string)) {
	t.Helper()
	i := 0
	next := func() {
		i++
		do("alloc-" + strconv.Itoa(i))
	}
	for range 50 {
		next()
	}
	if n := testing.AllocsPerRun(500, next); n > bound {
		t.Errorf("%s: %.0f allocations, want at most %.0f", what, n, bound)
	} else {
		t.Logf("%s: %.0f allocations (bound %.0f)", what, n, bound)
	}
}

// withAndWithoutAutoPipeline runs f on a store of its own with
// Config.AutoPipeline off, then on.
func withAndWithoutAutoPipeline(t *testing.T, f func(t *testing.T, client *goredis.Client, store *redis.Store)) {
	for _, ap := range []bool{false, true} {
		t.Run("AutoPipeline="+strconv.FormatBool(ap), func(t *testing.T) {
			client := goredis.NewClient(&goredis.Options{Addr: server.Addr})
			t.Cleanup(func() { _ = client.Close() })
			f(t, client, newStore(t, client, redis.Config{KeyPrefix: watchPrefix(t.Name()), AutoPipeline: ap}))
		})
	}
}

// TestCompleteAfterScriptFlush: a server that lost its script cache
// (SCRIPT FLUSH, a restart, a failover to a replica that never ran the
// script) answers EVALSHA with NOSCRIPT; Complete and Release then send the
// script itself, alone and with AutoPipeline.
func TestCompleteAfterScriptFlush(t *testing.T) {
	withAndWithoutAutoPipeline(t, func(t *testing.T, client *goredis.Client, store *redis.Store) {
		ctx := context.Background()
		for i, finish := range []func(dedup.Claim) error{
			func(c dedup.Claim) error { return store.Complete(ctx, c, []byte("r"), benchLease) },
			func(c dedup.Claim) error { return store.Release(ctx, c) },
		} {
			if err := client.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			key := "flushed-" + strconv.Itoa(i)
			res, err := store.Claim(ctx, key, "", benchLease)
			if err != nil || res.Outcome != dedup.Acquired {
				t.Fatalf("claim: %v %v", res.Outcome, err)
			}
			if err := finish(res.Claim); err != nil {
				t.Fatalf("finish %d after SCRIPT FLUSH: %v", i, err)
			}
			res, err = store.Claim(ctx, key, "", benchLease)
			want := []dedup.Outcome{dedup.Duplicate, dedup.Acquired}[i]
			if err != nil || res.Outcome != want {
				t.Fatalf("claim after finish %d: %v %v, want %v", i, res.Outcome, err, want)
			}
		}
	})
}
