package redis_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/internal/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// adminPrefix is a store prefix of the test's own on the shared server.
func adminPrefix(name string) string {
	return fmt.Sprintf("admintest-%s-%d:", name, time.Now().UnixNano())
}

// claimKey claims key and, unless result is nil, completes it.
func claimKey(t *testing.T, s dedup.Store, key, fp string, lease time.Duration, result []byte, retention time.Duration) dedup.Claim {
	t.Helper()
	ctx := context.Background()
	res, err := s.Claim(ctx, key, fp, lease)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("Claim %q: %v %v", key, res.Outcome, err)
	}
	if result != nil {
		if err := s.Complete(ctx, res.Claim, result, retention); err != nil {
			t.Fatalf("Complete %q: %v", key, err)
		}
	}
	return res.Claim
}

func TestAdminInspect(t *testing.T) {
	ctx := context.Background()
	client := newClient(t)
	store := newStore(t, client, redis.Config{KeyPrefix: adminPrefix("inspect")})

	held := admin.ScopedKey("charge-orders", "ORDER-1")
	done := admin.ScopedKey("charge-orders", "ORDER-2")
	claimKey(t, store, held, "payload-sha", time.Hour, nil, 0)
	claimKey(t, store, done, "", time.Hour, []byte("stored result"), 24*time.Hour)

	got, err := store.Inspect(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("payload-sha"))
	if got.Key != held || got.State != admin.StateInProgress || got.Fingerprint != hex.EncodeToString(sum[:16]) ||
		got.ResultSize != 0 || !got.Created.IsZero() || got.Problem != "" {
		t.Errorf("Inspect in progress = %+v", got)
	}
	// The remaining lease is the key's TTL: at most the lease, and shorter
	// than the retention of the completed record below.
	if got.Remaining <= 0 || got.Remaining > time.Hour {
		t.Errorf("remaining lease %v, want in (0, 1h]", got.Remaining)
	}

	got, err = store.Inspect(ctx, done)
	if err != nil {
		t.Fatal(err)
	}
	if got.Key != done || got.State != admin.StateCompleted || got.Fingerprint != "" || got.ResultSize != len("stored result") {
		t.Errorf("Inspect completed = %+v", got)
	}
	if got.Remaining <= time.Hour || got.Remaining > 24*time.Hour {
		t.Errorf("remaining retention %v, want in (1h, 24h]", got.Remaining)
	}

	if _, err := store.Inspect(ctx, "charge-orders:ORDER-3"); !errors.Is(err, admin.ErrNotFound) {
		t.Errorf("Inspect of a missing key: %v, want ErrNotFound", err)
	}
	foreign := "charge-orders:foreign"
	if err := client.Set(ctx, store.RedisKey(foreign), "hello", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Inspect(ctx, foreign); !errors.Is(err, redis.ErrUnknownFormat) {
		t.Errorf("Inspect of a foreign value: %v, want ErrUnknownFormat", err)
	}
	// A record someone made persistent is shown, with the problem.
	if err := client.Persist(ctx, store.RedisKey(done)).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := store.Inspect(ctx, done); err != nil || got.Remaining != 0 || got.Problem == "" {
		t.Errorf("Inspect of a record without TTL = %+v, %v; want a problem", got, err)
	}
}

// Evict deletes a record whatever its owner: the owner's claim is lost and
// the key can be claimed again.
func TestAdminEvict(t *testing.T) {
	ctx := context.Background()
	store := newStore(t, newClient(t), redis.Config{KeyPrefix: adminPrefix("evict")})
	held := claimKey(t, store, "s:held", "", time.Hour, nil, 0)
	claimKey(t, store, "s:done", "", time.Hour, []byte("r"), time.Hour)
	for _, key := range []string{"s:held", "s:done"} {
		if ok, err := store.Evict(ctx, key); !ok || err != nil {
			t.Fatalf("Evict %q = %v, %v; want true", key, ok, err)
		}
		if ok, err := store.Evict(ctx, key); ok || err != nil {
			t.Fatalf("second Evict %q = %v, %v; want false", key, ok, err)
		}
		if _, err := store.Inspect(ctx, key); !errors.Is(err, admin.ErrNotFound) {
			t.Fatalf("Inspect after Evict %q: %v", key, err)
		}
	}
	if err := store.Complete(ctx, held, nil, time.Hour); !errors.Is(err, dedup.ErrClaimLost) || !errors.Is(err, redis.ErrExpired) {
		t.Errorf("Complete of an evicted claim: %v, want ErrClaimLost (ErrExpired)", err)
	}
	if res, err := store.Claim(ctx, "s:done", "", time.Hour); err != nil || res.Outcome != dedup.Acquired {
		t.Errorf("Claim after Evict = %v, %v; want acquired", res.Outcome, err)
	}
}

// listAll pages through List and returns the keys (each once) in order; it
// checks every page's size and records.
func listAll(t *testing.T, a admin.Interface, prefix string, limit int) (keys []string, pages int) {
	t.Helper()
	seen := map[string]bool{}
	cursor := ""
	for {
		pages++
		if pages > 10_000 {
			t.Fatal("List does not end")
		}
		recs, next, err := a.List(context.Background(), prefix, cursor, limit)
		if err != nil {
			t.Fatalf("List page %d: %v", pages, err)
		}
		if len(recs) > limit {
			t.Fatalf("List page %d has %d records, limit %d", pages, len(recs), limit)
		}
		for _, r := range recs {
			if !strings.HasPrefix(r.Key, prefix) {
				t.Errorf("List(%q) gave %q", prefix, r.Key)
			}
			if r.State != admin.StateUnreadable && (r.Remaining <= 0 || r.State != admin.StateCompleted && r.State != admin.StateInProgress) {
				t.Errorf("List record %+v", r)
			}
			if !seen[r.Key] { // SCAN may return a key twice
				seen[r.Key] = true
				keys = append(keys, r.Key)
			}
		}
		if next == "" {
			sort.Strings(keys)
			return keys, pages
		}
		cursor = next
	}
}

// makeRecords creates n completed records of scope and returns their keys,
// sorted.
func makeRecords(t *testing.T, s dedup.Store, scope string, n int) []string {
	t.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = admin.ScopedKey(scope, fmt.Sprintf("ORDER-%04d", i))
		claimKey(t, s, keys[i], "", time.Hour, []byte{}, time.Hour)
	}
	sort.Strings(keys)
	return keys
}

func TestAdminList(t *testing.T) {
	ctx := context.Background()
	client := newClient(t)
	// Glob characters in the store prefix and in the scope are matched
	// literally.
	store := newStore(t, client, redis.Config{KeyPrefix: adminPrefix("li*st?[x]")})
	want := makeRecords(t, store, "charge*[orders]?", 23)
	others := makeRecords(t, store, "charge*[orders]?:eu", 4) // scope "…:eu" escapes to "…%3Aeu"
	makeRecords(t, store, "charge-orders", 3)                 // would match the unescaped glob
	// The same scoped keys under another store prefix are not listed.
	makeRecords(t, newStore(t, client, redis.Config{KeyPrefix: adminPrefix("list-other")}), "charge*[orders]?", 3)

	prefix := admin.ScopePrefix("charge*[orders]?")
	for _, limit := range []int{1, 7, 23, 1000} {
		got, _ := listAll(t, store, prefix, limit)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("limit %d: List = %v, want %v", limit, got, want)
		}
	}
	all, _ := listAll(t, store, "", 10)
	if len(all) != len(want)+len(others)+3 {
		t.Errorf("List everything: %d keys, want %d", len(all), len(want)+len(others)+3)
	}

	// A value of another format (or type) under the prefix is listed as
	// unreadable, not an error.
	for key, set := range map[string]func(string) error{
		prefix + "foreign-string": func(k string) error { return client.Set(ctx, k, "hello", time.Hour).Err() },
		prefix + "foreign-hash":   func(k string) error { return client.HSet(ctx, k, "a", "b").Err() },
	} {
		if err := set(store.RedisKey(key)); err != nil {
			t.Fatal(err)
		}
	}
	recs, next, err := store.List(ctx, prefix+"foreign", "", 10)
	if err != nil || next != "" || len(recs) != 2 {
		t.Fatalf("List foreign = %+v, %q, %v", recs, next, err)
	}
	for _, r := range recs {
		if r.State != admin.StateUnreadable || r.Problem == "" {
			t.Errorf("foreign value listed as %+v", r)
		}
	}

	_, cursor, err := store.List(ctx, prefix, "", 5)
	if err != nil || cursor == "" {
		t.Fatalf("first page: %q, %v", cursor, err)
	}
	if _, _, err := store.List(ctx, "another:", cursor, 5); !errors.Is(err, admin.ErrInvalidCursor) {
		t.Errorf("cursor of another prefix: %v, want ErrInvalidCursor", err)
	}
	if _, _, err := store.List(ctx, prefix, "garbage!", 5); !errors.Is(err, admin.ErrInvalidCursor) {
		t.Errorf("garbage cursor: %v, want ErrInvalidCursor", err)
	}
	if _, _, err := store.List(ctx, prefix, "", 0); err == nil {
		t.Error("limit 0: no error")
	}
}

// A few matching keys among many others in a database of their own: pages
// may come back short or empty, the listing still finds every key, and
// dense runs of matching keys keep the cursor small.
func TestAdminListSparseAndDense(t *testing.T) {
	ctx := context.Background()
	client := goredis.NewClient(&goredis.Options{Addr: server.Addr, DB: 7})
	t.Cleanup(func() { _ = client.Close() })
	if err := client.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	store := newStore(t, client, redis.Config{KeyPrefix: "dedup:"})
	pipe := client.Pipeline()
	for i := range 20_000 {
		pipe.Set(ctx, fmt.Sprintf("unrelated:%d", i), "x", time.Hour)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	sparse := makeRecords(t, store, "rare", 3)
	got, pages := listAll(t, store, admin.ScopePrefix("rare"), 2)
	if fmt.Sprint(got) != fmt.Sprint(sparse) {
		t.Errorf("sparse: List = %v, want %v", got, sparse)
	}
	t.Logf("sparse: %d keys among 20000 in %d pages", len(got), pages)

	dense := makeRecords(t, store, "dense", 3000)
	cursor, n, maxCursor := "", 0, 0
	for {
		recs, next, err := store.List(ctx, admin.ScopePrefix("dense"), cursor, 3)
		if err != nil {
			t.Fatal(err)
		}
		n += len(recs)
		maxCursor = max(maxCursor, len(next))
		if next == "" {
			break
		}
		cursor = next
	}
	if n < len(dense) {
		t.Errorf("dense: listed %d records, want at least %d", n, len(dense))
	}
	// The cursor carries only what one SCAN reply of a few buckets brought
	// beyond the page, never hundreds of keys.
	if maxCursor > 1024 {
		t.Errorf("dense: a cursor of %d bytes", maxCursor)
	}
	t.Logf("dense: longest cursor %d bytes", maxCursor)
}

// On a 3-master Cluster, List scans every master in turn and the cursor
// carries the master's address; Inspect and Evict route by key.
func TestAdminCluster(t *testing.T) {
	cluster, err := testserver.StartRedisCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Close() })
	client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cluster.Addrs})
	t.Cleanup(func() { _ = client.Close() })
	store := newStore(t, client, redis.Config{})
	ctx := context.Background()

	want := makeRecords(t, store, "charge-orders", 60)
	makeRecords(t, store, "refunds", 10)
	for _, addr := range cluster.Addrs {
		node := goredis.NewClient(&goredis.Options{Addr: addr})
		n, err := node.DBSize(ctx).Result()
		_ = node.Close()
		if err != nil || n == 0 {
			t.Fatalf("master %s holds %d keys (%v): the test needs records on every master", addr, n, err)
		}
	}
	// Limit 1 crosses from master to master through the cursor; limit
	// 1000 scans all three within one call.
	for _, limit := range []int{1, 7, 1000} {
		got, _ := listAll(t, store, admin.ScopePrefix("charge-orders"), limit)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("limit %d: List = %v, want %v", limit, got, want)
		}
	}

	rec, err := store.Inspect(ctx, want[0])
	if err != nil || rec.State != admin.StateCompleted {
		t.Fatalf("Inspect = %+v, %v", rec, err)
	}
	if ok, err := store.Evict(ctx, want[0]); !ok || err != nil {
		t.Fatalf("Evict = %v, %v", ok, err)
	}
	got, _ := listAll(t, store, admin.ScopePrefix("charge-orders"), 25)
	if fmt.Sprint(got) != fmt.Sprint(want[1:]) {
		t.Errorf("after Evict: List = %v, want %v", got, want[1:])
	}

	// A cursor naming a node that is not a master is refused.
	_, cursor, err := store.List(ctx, "", "", 1)
	if err != nil || cursor == "" {
		t.Fatalf("List: %q, %v", cursor, err)
	}
	if _, _, err := store.List(ctx, "", retargetCursor(t, cursor, "127.0.0.1:1"), 1); !errors.Is(err, admin.ErrInvalidCursor) {
		t.Errorf("cursor of an unknown node: %v, want ErrInvalidCursor", err)
	}
}

// retargetCursor returns cursor with its node replaced by addr. The cursor
// is base64url JSON; the node is field "n".
func retargetCursor(t *testing.T, cursor, addr string) string {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if _, ok := c["n"]; !ok {
		t.Fatalf("cursor %s names no node", b)
	}
	c["n"] = addr
	if b, err = json.Marshal(c); err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}
