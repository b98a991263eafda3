package redis_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storetest"
	"github.com/watermill-dedup/watermill-dedup/internal/storekit"
	"github.com/watermill-dedup/watermill-dedup/internal/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// Expiry is decided by the server (PX), so the suite waits in real time and
// every subtest shares one store.
func TestConformanceStandalone(t *testing.T) {
	store := newStore(t, newClient(t), redis.Config{})
	storetest.Run(t, func(t *testing.T) (dedup.Store, func(time.Duration)) {
		return store, nil
	}, storetest.Features{ShortDuration: 300 * time.Millisecond})
}

// The Lua claim that the benchmark compares with SET NX PX GET must be
// equivalent, or the comparison means nothing.
func TestConformanceLuaClaim(t *testing.T) {
	store := redis.LuaClaimStore{Store: newStore(t, newClient(t), redis.Config{KeyPrefix: "dedup-lua:"})}
	storetest.Run(t, func(t *testing.T) (dedup.Store, func(time.Duration)) {
		return store, nil
	}, storetest.Features{ShortDuration: 300 * time.Millisecond})
}

// A 3-master Redis Cluster on free loopback ports: the suite through a
// ClusterClient, then a check that the records were spread over every master
// (each record is one key, so no operation spans slots).
func TestConformanceCluster(t *testing.T) {
	cluster, err := testserver.StartRedisCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Close() })
	client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cluster.Addrs})
	t.Cleanup(func() { _ = client.Close() })
	store := newStore(t, client, redis.Config{})

	t.Run("suite", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) (dedup.Store, func(time.Duration)) {
			return store, nil
		}, storetest.Features{ShortDuration: 300 * time.Millisecond})
	})
	// Config.AutoPipeline on a Cluster: go-redis splits each batch per
	// master by the slots of its keys.
	pipelined := newStore(t, client, redis.Config{KeyPrefix: "dedup-ap:", AutoPipeline: true})
	t.Run("suite-autopipeline", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) (dedup.Store, func(time.Duration)) {
			return pipelined, nil
		}, storetest.Features{ShortDuration: 300 * time.Millisecond})
	})

	ctx := context.Background()
	for _, addr := range cluster.Addrs {
		node := goredis.NewClient(&goredis.Options{Addr: addr})
		n, err := node.DBSize(ctx).Result()
		_ = node.Close()
		if err != nil {
			t.Fatalf("DBSIZE on %s: %v", addr, err)
		}
		if n == 0 {
			t.Errorf("master %s holds no record: keys were not spread over the cluster", addr)
		}
	}
}

// Every operation refuses a cancelled context with its error, before or while
// talking to Redis, and a cancelled claim creates nothing.
func TestCancelledContext(t *testing.T) {
	store := newStore(t, newClient(t), redis.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	key := fmt.Sprint("cancelled-", time.Now().UnixNano())
	if _, err := store.Claim(ctx, key, "", time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("Claim with a cancelled context: %v, want context.Canceled", err)
	}
	c := dedup.Claim{Key: key, Token: storekit.NewToken()}
	for name, err := range map[string]error{
		"Complete": store.Complete(ctx, c, nil, time.Minute),
		"Release":  store.Release(ctx, c),
		"Extend":   store.Extend(ctx, c, time.Minute),
	} {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: %v, want context.Canceled", name, err)
		}
	}
	res, err := store.Claim(context.Background(), key, "", time.Minute)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("claim after the cancelled one: %v %v, want acquired", res.Outcome, err)
	}
}

// A master found through Redis Sentinel (go-redis' FailoverClient): the
// same store, unchanged.
func TestConformanceSentinel(t *testing.T) {
	master, err := testserver.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = master.Close() })
	sentinel, err := testserver.StartRedisSentinel(master.Addr, "dedup-master")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sentinel.Close() })
	client := goredis.NewFailoverClient(&goredis.FailoverOptions{MasterName: "dedup-master", SentinelAddrs: []string{sentinel.Addr}})
	t.Cleanup(func() { _ = client.Close() })
	store := newStore(t, client, redis.Config{})

	t.Run("suite", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) (dedup.Store, func(time.Duration)) {
			return store, nil
		}, storetest.Features{ShortDuration: 300 * time.Millisecond})
	})

	// The records are on the master the Sentinel named.
	node := goredis.NewClient(&goredis.Options{Addr: master.Addr})
	defer node.Close()
	if n, err := node.DBSize(context.Background()).Result(); err != nil || n == 0 {
		t.Fatalf("master %s holds %d keys (%v), want the suite's records", master.Addr, n, err)
	}
}
