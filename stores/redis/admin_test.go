package redis_test

import (
	"context"
	"encoding/base64"
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
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
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

// What only Redis shows: a value under the prefix that is not a record is
// refused by Inspect with ErrUnknownFormat, a record someone made
// persistent is shown with its problem, and an evicted claim is lost as
// expired (the key is gone). The rest of Inspect and Evict is
// storetest.RunAdmin (TestAdmin).
func TestAdminInspectRedisValues(t *testing.T) {
	ctx := context.Background()
	client := newClient(t)
	store := newStore(t, client, redis.Config{KeyPrefix: adminPrefix("inspect")})

	foreign := "charge-orders:foreign"
	if err := client.Set(ctx, store.RedisKey(foreign), "hello", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Inspect(ctx, foreign); !errors.Is(err, redis.ErrUnknownFormat) {
		t.Errorf("Inspect of a foreign value: %v, want ErrUnknownFormat", err)
	}
	done := admin.ScopedKey("charge-orders", "ORDER-2")
	claimKey(t, store, done, "", time.Hour, []byte("stored result"), 24*time.Hour)
	if err := client.Persist(ctx, store.RedisKey(done)).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := store.Inspect(ctx, done); err != nil || got.Remaining != 0 || got.Problem == "" {
		t.Errorf("Inspect of a record without TTL = %+v, %v; want a problem", got, err)
	}

	held := claimKey(t, store, "s:held", "", time.Hour, nil, 0)
	if ok, err := store.Evict(ctx, held.Key); !ok || err != nil {
		t.Fatalf("Evict = %v, %v; want true", ok, err)
	}
	if err := store.Complete(ctx, held, nil, time.Hour); !errors.Is(err, dedup.ErrClaimLost) || !errors.Is(err, redis.ErrExpired) {
		t.Errorf("Complete of an evicted claim: %v, want ErrClaimLost (ErrExpired)", err)
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

// What only Redis lists: the same scoped keys under another store prefix
// on the same server are not listed, and a value of another format (or
// type) under the prefix is listed as unreadable, not an error. Paging,
// scope prefixes and cursors are storetest.RunAdmin (TestAdmin).
func TestAdminListRedisValues(t *testing.T) {
	ctx := context.Background()
	client := newClient(t)
	// Glob characters in the store prefix are matched literally.
	store := newStore(t, client, redis.Config{KeyPrefix: adminPrefix("li*st?[x]")})
	want := makeRecords(t, store, "charge-orders", 5)
	makeRecords(t, newStore(t, client, redis.Config{KeyPrefix: adminPrefix("list-other")}), "charge-orders", 3)
	prefix := admin.ScopePrefix("charge-orders")
	if got, _ := listAll(t, store, prefix, 2); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("List = %v, want %v (only this store prefix's records)", got, want)
	}

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

// On a Cluster the List cursor carries the master's address, and a cursor
// naming a node that is not a master is refused. Listing over every master,
// Inspect and Evict routed by key are storetest.RunAdmin on a Cluster
// (TestConformanceCluster).
func TestAdminClusterCursor(t *testing.T) {
	cluster, err := testserver.StartRedisCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Close() })
	client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cluster.Addrs})
	t.Cleanup(func() { _ = client.Close() })
	store := newStore(t, client, redis.Config{})
	ctx := context.Background()

	want := makeRecords(t, store, "charge-orders", 30)
	// Limit 1 crosses from master to master through the cursor.
	if got, _ := listAll(t, store, admin.ScopePrefix("charge-orders"), 1); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("List = %v, want %v", got, want)
	}
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
