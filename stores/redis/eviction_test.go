package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

func startRedis(t *testing.T, args ...string) *testserver.Redis {
	t.Helper()
	r, err := testserver.StartRedisWithArgs(args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func clientOf(t *testing.T, opts *goredis.Options) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func newWith(t *testing.T, client goredis.UniversalClient, config redis.Config) (*redis.Store, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	config.Client = client
	return redis.New(ctx, config)
}

// expectEvictionRefused checks that err is the typed refusal naming policy.
func expectEvictionRefused(t *testing.T, err error, addr, policy string) {
	t.Helper()
	var perr *redis.EvictionPolicyError
	if !errors.Is(err, redis.ErrEvictionPolicy) || !errors.As(err, &perr) {
		t.Fatalf("New on a server with maxmemory-policy %s: %v, want an *EvictionPolicyError matching ErrEvictionPolicy", policy, err)
	}
	if perr.Policy != policy || (addr != "" && perr.Addr != addr) {
		t.Fatalf("error %v names %s policy %q, want %s %q", err, perr.Addr, perr.Policy, addr, policy)
	}
}

// With allkeys-lru a full server evicts completed records, and the next copy
// runs its effect again; the volatile-* policies pick exactly the keys with
// a TTL, which every record has. New refuses every policy but noeviction,
// unless the caller allows eviction.
func TestNewRefusesEvictionPolicy(t *testing.T) {
	r := startRedis(t, "--maxmemory-policy", "allkeys-lru")
	client := clientOf(t, &goredis.Options{Addr: r.Addr})
	_, err := newWith(t, client, redis.Config{})
	expectEvictionRefused(t, err, r.Addr, "allkeys-lru")

	ctx := context.Background()
	for _, policy := range []string{"volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl", "allkeys-lfu", "allkeys-random"} {
		if err := client.ConfigSet(ctx, "maxmemory-policy", policy).Err(); err != nil {
			t.Fatal(err)
		}
		_, err := newWith(t, client, redis.Config{})
		expectEvictionRefused(t, err, r.Addr, policy)

		store, err := newWith(t, client, redis.Config{AllowEviction: true})
		if err != nil {
			t.Fatalf("New with AllowEviction on %s: %v", policy, err)
		}
		if res, err := store.Claim(ctx, "k:"+policy, "", time.Minute); err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("claim with AllowEviction: %v %v", res.Outcome, err)
		}
	}
	if err := client.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := newWith(t, client, redis.Config{}); err != nil {
		t.Fatalf("New on noeviction: %v", err)
	}
}

// Managed Redis (ElastiCache, MemoryStore) refuses CONFIG. The policy is
// still read (INFO memory), so an evicting server is still refused, and a
// noeviction one works without a warning.
func TestNewWithConfigRenamed(t *testing.T) {
	for _, policy := range []string{"allkeys-lru", "noeviction"} {
		r := startRedis(t, "--rename-command", "CONFIG", "", "--maxmemory-policy", policy)
		client := clientOf(t, &goredis.Options{Addr: r.Addr})
		if err := client.ConfigGet(context.Background(), "maxmemory-policy").Err(); err == nil {
			t.Fatalf("CONFIG GET works on the server started with CONFIG renamed")
		}
		logger := watermill.NewCaptureLogger()
		store, err := newWith(t, client, redis.Config{Logger: logger})
		if policy != "noeviction" {
			expectEvictionRefused(t, err, r.Addr, policy)
			continue
		}
		if err != nil {
			t.Fatalf("New on noeviction with CONFIG renamed: %v", err)
		}
		if n := countLogs(logger); n != 0 {
			t.Fatalf("%d log lines for a server whose policy could be read", n)
		}
		if res, err := store.Claim(context.Background(), "k", "", time.Minute); err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("claim: %v %v", res.Outcome, err)
		}
	}
}

// A server that lets the client read neither INFO memory nor CONFIG (here
// an ACL user, on a server without CONFIG): New logs one warning through
// the store's logger and proceeds.
func TestNewWarnsOnceWhenPolicyUnreadable(t *testing.T) {
	r := startRedis(t, "--rename-command", "CONFIG", "")
	admin := clientOf(t, &goredis.Options{Addr: r.Addr})
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-info", "+info|server").Err(); err != nil {
		t.Fatal(err)
	}
	client := clientOf(t, &goredis.Options{Addr: r.Addr, Username: "app", Password: "secret"})
	if err := client.Info(ctx, "memory").Err(); err == nil {
		t.Fatal("the ACL user can read INFO memory")
	}
	logger := watermill.NewCaptureLogger()
	store, err := newWith(t, client, redis.Config{Logger: logger})
	if err != nil {
		t.Fatalf("New where the policy cannot be read: %v, want a store and a warning", err)
	}
	logs := logger.Captured()
	if n := countLogs(logger); n != 1 || len(logs[watermill.InfoLogLevel]) != 1 {
		t.Fatalf("log lines: %v, want exactly one warning at info level", logs)
	}
	w := logs[watermill.InfoLogLevel][0]
	if !strings.Contains(w.Msg, "maxmemory-policy") || w.Fields["addr"] != r.Addr {
		t.Fatalf("warning %q %v does not name the setting and the server", w.Msg, w.Fields)
	}
	if res, err := store.Claim(ctx, "k", "", time.Minute); err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("claim: %v %v", res.Outcome, err)
	}
	if n := countLogs(logger); n != 1 {
		t.Fatalf("%d log lines after a claim, want the one warning", n)
	}
}

func countLogs(l *watermill.CaptureLoggerAdapter) int {
	n := 0
	for _, msgs := range l.Captured() {
		n += len(msgs)
	}
	return n
}

// On a Cluster every master is checked: one evicting master is enough to
// refuse, and the error names it.
func TestNewChecksEveryClusterMaster(t *testing.T) {
	cluster, err := testserver.StartRedisCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Close() })
	client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cluster.Addrs})
	t.Cleanup(func() { _ = client.Close() })
	if _, err := newWith(t, client, redis.Config{}); err != nil {
		t.Fatalf("New on a noeviction cluster: %v", err)
	}
	for i, addr := range cluster.Addrs {
		node := clientOf(t, &goredis.Options{Addr: addr})
		ctx := context.Background()
		if err := node.ConfigSet(ctx, "maxmemory-policy", "volatile-ttl").Err(); err != nil {
			t.Fatal(err)
		}
		_, err := newWith(t, client, redis.Config{})
		expectEvictionRefused(t, err, addr, "volatile-ttl")
		if err := node.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := newWith(t, client, redis.Config{}); err != nil {
			t.Fatalf("New after master #%d went back to noeviction: %v", i, fmt.Sprint(err))
		}
	}
}
