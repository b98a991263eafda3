package redis_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis" // go-redis keeps its name
)

// One record on a real redis-server: claimed, completed with its result, a
// duplicate, seen by an operator, and evicted (so the example leaves
// nothing behind). The record is one Redis string under the store's
// prefix.
func ExampleNew() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: server.Addr}) // the test's redis-server; yours: "127.0.0.1:6379"
	defer client.Close()
	store, err := dedupredis.New(ctx, dedupredis.Config{Client: client, KeyPrefix: "example:"})
	if err != nil {
		panic(err) // unreachable, older than Redis 7.0, or an evicting maxmemory-policy
	}
	key := admin.ScopedKey("charge-orders", "ORDER-003")
	res, err := store.Claim(ctx, key, "", 30*time.Second)
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Outcome)
	if err := store.Complete(ctx, res.Claim, []byte("receipt-7"), 24*time.Hour); err != nil {
		panic(err)
	}
	dup, err := store.Claim(ctx, key, "", 30*time.Second)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s %q\n", dup.Outcome, dup.Result)

	fmt.Println(client.Type(ctx, "example:charge-orders:ORDER-003").Val())
	rec, err := store.Inspect(ctx, key)
	if err != nil {
		panic(err)
	}
	fmt.Println(rec.State, rec.ResultSize, rec.Remaining > 23*time.Hour)
	evicted, err := store.Evict(ctx, key)
	fmt.Println("evicted:", evicted, err)
	// Output:
	// acquired
	// duplicate "receipt-7"
	// string
	// completed 9 true
	// evicted: true <nil>
}
