package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// TestEvictingRedisWithAllowEviction: on a Redis whose maxmemory-policy
// evicts keys (managed Redis defaults), the consumers' store refuses to
// open; an operator still inspects, lists and evicts with -allow-eviction,
// warned of the policy. Without the flag the refusal says to pass it.
// (dedupctl had no way to open such a server.)
func TestEvictingRedisWithAllowEviction(t *testing.T) {
	r, err := testserver.StartRedisWithArgs("--maxmemory-policy", "allkeys-lru")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	client := goredis.NewClient(&goredis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = client.Close() })
	store, err := dedupredis.New(context.Background(), dedupredis.Config{Client: client, AllowEviction: true})
	if err != nil {
		t.Fatal(err)
	}
	key := admin.ScopedKey("charge-orders", "ORDER-1")
	create(t, store, key, "", []byte("ok"))
	flags := []string{"-redis-addr", r.Addr}

	code, _, errOut := ctl(t, append(flags, "inspect", key)...)
	if code == exitOK || !strings.Contains(errOut, "-allow-eviction") || !strings.Contains(errOut, "allkeys-lru") {
		t.Errorf("without -allow-eviction: exit %d, stderr %q; want a refusal naming the policy and -allow-eviction", code, errOut)
	}
	for _, cmd := range [][]string{{"inspect", key}, {"list", "-scope", "charge-orders"}, {"evict", key}} {
		code, out, errOut := ctl(t, append(append(flags, "-allow-eviction"), cmd...)...)
		if code != exitOK || !strings.Contains(out, "ORDER-1") {
			t.Errorf("%v with -allow-eviction: exit %d\nstdout:\n%s\nstderr:\n%s", cmd, code, out, errOut)
		}
		if !strings.Contains(errOut, "warning") || !strings.Contains(errOut, "allkeys-lru") {
			t.Errorf("%v with -allow-eviction: no warning about the policy on stderr: %q", cmd, errOut)
		}
	}
	if _, err := store.Inspect(context.Background(), key); err == nil {
		t.Error("the record is still there after evict")
	}
}

// TestInspectWithoutScopeSuggestsScope: a KEY that finds nothing, given
// without -scope, is most likely a business key: the message says to pass
// -scope (it only said there was no record).
func TestInspectWithoutScopeSuggestsScope(t *testing.T) {
	client := goredis.NewClient(&goredis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = client.Close() })
	prefix := fmt.Sprintf("dedupctl-scope-%d:", time.Now().UnixNano())
	store, err := dedupredis.New(context.Background(), dedupredis.Config{Client: client, KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	create(t, store, admin.ScopedKey("charge-orders", "ORDER-7"), "", []byte{})
	flags := []string{"-redis-addr", redisAddr, "-redis-prefix", prefix}
	for _, cmd := range []string{"inspect", "evict"} {
		code, _, errOut := ctl(t, append(flags, cmd, "ORDER-7")...)
		if code != exitNotFound || !strings.Contains(errOut, "-scope") {
			t.Errorf("%s ORDER-7: exit %d, stderr %q; want %d and a hint to pass -scope", cmd, code, errOut, exitNotFound)
		}
	}
	// With -scope it is found; a scoped key that finds nothing gets no hint.
	mustCtl(t, exitOK, append(flags, "inspect", "-scope", "charge-orders", "ORDER-7")...)
	code, _, errOut := ctl(t, append(flags, "inspect", "-scope", "charge-orders", "ORDER-8")...)
	if code != exitNotFound || strings.Contains(errOut, "pass -scope") {
		t.Errorf("inspect -scope charge-orders ORDER-8: exit %d, stderr %q; want %d without the hint", code, errOut, exitNotFound)
	}
}
