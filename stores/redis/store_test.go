package redis_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

func uniqueKey(name string) string {
	return fmt.Sprintf("%s-%d", name, time.Now().UnixNano())
}

// The record of a scoped key is one Redis string at prefix + scoped key, its
// TTL is the lease while in progress and the retention once completed.
func TestKeyLayoutAndTTL(t *testing.T) {
	ctx := context.Background()
	client := newClient(t)
	for _, tc := range []struct{ prefix, wantPrefix string }{
		{"", "dedup:"},
		{"billing/dedup:", "billing/dedup:"},
	} {
		store := newStore(t, client, redis.Config{KeyPrefix: tc.prefix})
		key := admin.ScopedKey("charge-orders", uniqueKey("ORDER"))
		redisKey := tc.wantPrefix + key
		if got := store.RedisKey(key); got != redisKey {
			t.Fatalf("RedisKey(%q) = %q, want %q", key, got, redisKey)
		}

		const lease, retention = 10 * time.Minute, 5 * time.Hour
		res, err := store.Claim(ctx, key, "", lease)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("Claim: %v %v", res.Outcome, err)
		}
		if typ := client.Type(ctx, redisKey).Val(); typ != "string" {
			t.Fatalf("type of %q = %q, want string", redisKey, typ)
		}
		if ttl := client.PTTL(ctx, redisKey).Val(); ttl <= 0 || ttl > lease {
			t.Fatalf("in-progress TTL = %v, want within the lease %v", ttl, lease)
		}
		if err := store.Complete(ctx, res.Claim, nil, retention); err != nil {
			t.Fatal(err)
		}
		if ttl := client.PTTL(ctx, redisKey).Val(); ttl <= lease || ttl > retention {
			t.Fatalf("completed TTL = %v, want the retention %v", ttl, retention)
		}
		if n := client.Exists(ctx, key).Val(); n != 0 {
			t.Fatalf("a key without the prefix exists")
		}
	}
}

// Sub-millisecond leases are rounded up to 1ms, not sent as PX 0 (which
// Redis refuses) or left without a TTL.
func TestSubMillisecondLease(t *testing.T) {
	ctx := context.Background()
	client := newClient(t)
	store := newStore(t, client, redis.Config{})
	key := uniqueKey("sub-ms")
	res, err := store.Claim(ctx, key, "", 300*time.Microsecond)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("Claim: %v %v", res.Outcome, err)
	}
	if ttl := client.PTTL(ctx, store.RedisKey(key)).Val(); ttl > time.Millisecond || ttl == -1 {
		t.Fatalf("TTL = %v, want at most 1ms", ttl)
	}
}

// The three ways to lose a claim are told apart: every error matches
// dedup.ErrClaimLost and exactly one reason.
func TestLostClaimReasons(t *testing.T) {
	ctx := context.Background()
	store := newStore(t, newClient(t), redis.Config{})
	reasons := []error{redis.ErrExpired, redis.ErrNotOwner, redis.ErrAlreadyCompleted, redis.ErrUnknownFormat}
	check := func(t *testing.T, op string, err, want error) {
		t.Helper()
		if !errors.Is(err, dedup.ErrClaimLost) {
			t.Fatalf("%s: %v, want ErrClaimLost", op, err)
		}
		for _, r := range reasons {
			if errors.Is(err, r) != (r == want) {
				t.Fatalf("%s: %v: errors.Is(%v) = %v", op, err, r, !(r == want))
			}
		}
	}
	ops := func(c dedup.Claim) map[string]error {
		return map[string]error{
			"Complete": store.Complete(ctx, c, []byte("x"), time.Hour),
			"Release":  store.Release(ctx, c),
			"Extend":   store.Extend(ctx, c, time.Hour),
		}
	}

	t.Run("expired", func(t *testing.T) {
		key := uniqueKey("expired")
		res, err := store.Claim(ctx, key, "", 20*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // the server's PX runs out in real time
		for op, err := range ops(res.Claim) {
			check(t, op, err, redis.ErrExpired)
		}
	})
	t.Run("not owner", func(t *testing.T) {
		key := uniqueKey("taken")
		if _, err := store.Claim(ctx, key, "", time.Hour); err != nil {
			t.Fatal(err)
		}
		for op, err := range ops(dedup.Claim{Key: key, Token: storekit.NewToken()}) {
			check(t, op, err, redis.ErrNotOwner)
		}
		for op, err := range ops(dedup.Claim{Key: key, Token: "not-a-token-of-this-store"}) {
			check(t, op, err, redis.ErrNotOwner)
		}
	})
	t.Run("already completed", func(t *testing.T) {
		key := uniqueKey("completed")
		res, err := store.Claim(ctx, key, "", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Complete(ctx, res.Claim, []byte("first"), time.Hour); err != nil {
			t.Fatal(err)
		}
		for op, err := range ops(res.Claim) {
			check(t, op, err, redis.ErrAlreadyCompleted)
		}
		dup, err := store.Claim(ctx, key, "", time.Hour)
		if err != nil || dup.Outcome != dedup.Duplicate || string(dup.Result) != "first" {
			t.Fatalf("Claim after the refused ops = %v %q %v, want duplicate %q", dup.Outcome, dup.Result, err, "first")
		}
	})
}

// A value under the prefix that is not a record of this format is never
// decoded as one: Claim reports ErrUnknownFormat (a store error, not an
// outcome) and the token-checked operations leave it alone.
func TestForeignValue(t *testing.T) {
	ctx := context.Background()
	client := newClient(t)
	store := newStore(t, client, redis.Config{})
	for name, value := range map[string][]byte{
		"empty":          {},
		"text":           []byte("hello"),
		"future version": append([]byte{3, 'C'}, make([]byte, 40)...),
		"short":          {1, 'P', 1, 2, 3},
		"bad state":      append([]byte{1, 'X'}, make([]byte, 17)...),
		"long fp length": append(append([]byte{1, 'C'}, make([]byte, 16)...), 200, 1, 2),
	} {
		key := uniqueKey("foreign")
		if err := client.Set(ctx, store.RedisKey(key), value, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := store.Claim(ctx, key, "", time.Hour); !errors.Is(err, redis.ErrUnknownFormat) || errors.Is(err, dedup.ErrClaimLost) {
			t.Errorf("%s: Claim: %v, want ErrUnknownFormat", name, err)
		}
		c := dedup.Claim{Key: key, Token: storekit.NewToken()}
		for op, err := range map[string]error{
			"Complete": store.Complete(ctx, c, nil, time.Hour),
			"Release":  store.Release(ctx, c),
			"Extend":   store.Extend(ctx, c, time.Hour),
		} {
			if !errors.Is(err, dedup.ErrClaimLost) {
				t.Errorf("%s: %s: %v, want ErrClaimLost", name, op, err)
			}
		}
		if got, err := client.Get(ctx, store.RedisKey(key)).Bytes(); err != nil || !bytes.Equal(got, value) {
			t.Errorf("%s: the value changed to %q (%v)", name, got, err)
		}
	}
}

// A Config without a client is refused at New with ErrNoClient, before any
// round trip, whether the client is nil or a nil *redis.Client.
func TestNewNilClient(t *testing.T) {
	var nilClient *goredis.Client
	for name, config := range map[string]redis.Config{
		"nil":              {},
		"nil *Client":      {Client: nilClient},
		"with other error": {KeyPrefix: "a:b:"},
	} {
		store, err := redis.New(context.Background(), config)
		if !errors.Is(err, redis.ErrNoClient) || store != nil {
			t.Errorf("%s: New = %v, %v; want ErrNoClient", name, store, err)
		}
		if err := config.Validate(); !errors.Is(err, redis.ErrNoClient) {
			t.Errorf("%s: Validate = %v; want ErrNoClient", name, err)
		}
	}
}
