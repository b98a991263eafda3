package redis_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storetest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// features: expiry is decided by the server (PX), so the suite waits in
// real time; the fingerprint an operator sees is the hex of its 16-byte
// digest; the completing and releasing scripts announce the change to the
// key's watches (WatchKey); every won claim carries a fence, in every
// configuration (single server, Sentinel, Cluster, AutoPipeline,
// WaitReplicas, the Lua claim).
var features = storetest.Features{
	ShortDuration:    300 * time.Millisecond,
	AlreadyCompleted: true,
	Admin:            true,
	AdminFingerprint: func(fp string) string { sum := sha256.Sum256([]byte(fp)); return hex.EncodeToString(sum[:16]) },
	Provenance:       true,
	Watch:            true,
	Fencing:          true,
}

// shared returns a constructor that gives every case the same store.
func shared(store dedup.Store) storetest.Constructor {
	return func(*testing.T) (dedup.Store, func(time.Duration)) { return store, nil }
}

// countingStore is a store on a client of its own that counts the commands
// it sends (storetest.RequestCounter).
type countingStore struct {
	*redis.Store
	hook *countHook
}

func (s countingStore) Requests() int64 { return s.hook.n.Load() }

type countHook struct{ n atomic.Int64 }

func (h *countHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *countHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *countHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.n.Add(1) // one round trip
		return next(ctx, cmds)
	}
}

// newCountingStore gives each case a client and store of its own on the
// shared server, counting requests: SET NX PX GET answers every claim in
// one.
func newCountingStore(t *testing.T) (dedup.Store, func(time.Duration)) {
	client := newClient(t)
	hook := &countHook{}
	s := newStore(t, client, redis.Config{})
	client.AddHook(hook)
	return countingStore{Store: s, hook: hook}, nil
}

func TestConformanceStandalone(t *testing.T) {
	f := features
	f.OneRequestClaim = true
	storetest.Run(t, newCountingStore, f)
}

func TestAdmin(t *testing.T) { storetest.RunAdmin(t, newCountingStore, features) }

// The middleware through a Watermill router, on one store shared by every
// case.
func TestRouter(t *testing.T) {
	storetest.RunRouter(t, shared(newStore(t, newClient(t), redis.Config{})), features)
}

// With Config.OmitProvenance completed records carry no provenance (see
// TestOmitProvenance); the store contract is the same.
func TestConformanceOmitProvenance(t *testing.T) {
	store := newStore(t, newClient(t), redis.Config{KeyPrefix: "dedup-omit:", OmitProvenance: true})
	storetest.Run(t, shared(store), features)
}

// The Lua claim that the benchmark compares with SET NX PX GET must be
// equivalent, or the comparison means nothing.
func TestConformanceLuaClaim(t *testing.T) {
	store := redis.LuaClaimStore{Store: newStore(t, newClient(t), redis.Config{KeyPrefix: "dedup-lua:"})}
	storetest.Run(t, shared(store), features)
}

// A 3-master Redis Cluster on free loopback ports: the store and admin
// contracts through a ClusterClient (List scans every master in turn), then
// a check that the records were spread over every master (each record is
// one key, so no operation spans slots).
func TestConformanceCluster(t *testing.T) {
	cluster, err := testserver.StartRedisCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Close() })
	client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cluster.Addrs})
	t.Cleanup(func() { _ = client.Close() })
	store := newStore(t, client, redis.Config{})

	t.Run("suite", func(t *testing.T) { storetest.Run(t, shared(store), features) })
	t.Run("admin", func(t *testing.T) { storetest.RunAdmin(t, shared(store), features) })
	// Config.AutoPipeline on a Cluster: go-redis splits each batch per
	// master by the slots of its keys.
	pipelined := newStore(t, client, redis.Config{KeyPrefix: "dedup-ap:", AutoPipeline: true})
	t.Run("suite-autopipeline", func(t *testing.T) { storetest.Run(t, shared(pipelined), features) })

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
	pipelined := newStore(t, client, redis.Config{KeyPrefix: "dedup-ap:", AutoPipeline: true})

	t.Run("suite", func(t *testing.T) { storetest.Run(t, shared(store), features) })
	t.Run("suite-autopipeline", func(t *testing.T) { storetest.Run(t, shared(pipelined), features) })

	// The records are on the master the Sentinel named.
	node := goredis.NewClient(&goredis.Options{Addr: master.Addr})
	defer node.Close()
	if n, err := node.DBSize(context.Background()).Result(); err != nil || n == 0 {
		t.Fatalf("master %s holds %d keys (%v), want the suite's records", master.Addr, n, err)
	}
}
