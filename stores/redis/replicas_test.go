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
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

func TestWaitConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  redis.Config
		ok   bool
	}{
		{"off", redis.Config{}, true},
		{"on with the default timeout", redis.Config{WaitReplicas: 1}, true},
		{"on with a timeout", redis.Config{WaitReplicas: 2, WaitTimeout: 100 * time.Millisecond}, true},
		{"negative replicas", redis.Config{WaitReplicas: -1}, false},
		{"negative timeout", redis.Config{WaitReplicas: 1, WaitTimeout: -time.Second}, false},
		{"timeout under a millisecond", redis.Config{WaitReplicas: 1, WaitTimeout: time.Microsecond}, false},
		{"timeout without replicas", redis.Config{WaitTimeout: time.Second}, false},
	} {
		tc.cfg.Client = anyClient
		if err := tc.cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// New refuses what the option cannot work with, at construction.
func TestWaitRefusedClients(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": server.Addr}})
	t.Cleanup(func() { _ = ring.Close() })
	if _, err := redis.New(ctx, redis.Config{Client: ring, WaitReplicas: 1}); err == nil {
		t.Error("New accepted WaitReplicas with a Ring")
	}
	short := goredis.NewClient(&goredis.Options{Addr: server.Addr, ReadTimeout: 500 * time.Millisecond})
	t.Cleanup(func() { _ = short.Close() })
	if _, err := redis.New(ctx, redis.Config{Client: short, WaitReplicas: 1, WaitTimeout: time.Second}); err == nil {
		t.Error("New accepted a WaitTimeout longer than the client's ReadTimeout")
	}
	if _, err := redis.New(ctx, redis.Config{Client: short, WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond}); err != nil {
		t.Errorf("New with a WaitTimeout shorter than ReadTimeout: %v", err)
	}
}

// The shared server has no replica: with WaitReplicas every claim is
// refused with a *ReplicationError, and the refused claim is released, so
// the next copy is not held up by a lease nobody owns; a completion is
// refused the same way (a store error, not ErrClaimLost, so the engine
// retries it).
func TestWaitWithoutReplicaRefuses(t *testing.T) {
	ctx := context.Background()
	client := newClient(t)
	cfg := redis.Config{KeyPrefix: "wait-refused:", WaitReplicas: 1, WaitTimeout: 50 * time.Millisecond}
	store := newStore(t, client, cfg)
	res, err := store.Claim(ctx, "k1", "", time.Minute)
	var re *redis.ReplicationError
	if !errors.As(err, &re) || !errors.Is(err, redis.ErrNotReplicated) || errors.Is(err, dedup.ErrClaimLost) {
		t.Fatalf("Claim without a replica = %v, %v; want a *ReplicationError matching ErrNotReplicated", res.Outcome, err)
	}
	if re.Want != 1 || re.Got != 0 || re.Op != "claim" {
		t.Errorf("ReplicationError = %+v, want claim, Want 1, Got 0", re)
	}
	if n, err := client.Exists(ctx, store.RedisKey("k1")).Result(); err != nil || n != 0 {
		t.Errorf("the refused claim's record: EXISTS = %d, %v; want it released (0)", n, err)
	}

	plain := newStore(t, client, redis.Config{KeyPrefix: "wait-refused:"})
	res, err = plain.Claim(ctx, "k2", "", time.Minute)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("Claim without WaitReplicas = %v, %v", res.Outcome, err)
	}
	// Extend first: the refused Complete is applied on the master all the
	// same, after which Extend would find the record completed.
	for _, op := range []struct {
		name string
		err  error
	}{
		{"Extend", store.Extend(ctx, res.Claim, time.Minute)},
		{"Complete", store.Complete(ctx, res.Claim, []byte("r"), time.Minute)},
	} {
		name, err := op.name, op.err
		if !errors.Is(err, redis.ErrNotReplicated) || errors.Is(err, dedup.ErrClaimLost) {
			t.Errorf("%s without a replica = %v, want ErrNotReplicated (and not ErrClaimLost)", name, err)
		}
	}
	// Release does not wait.
	plain2, err := plain.Claim(ctx, "k3", "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Release(ctx, plain2.Claim); err != nil {
		t.Errorf("Release with WaitReplicas and no replica: %v, want nil", err)
	}
}

// With a replica, a claim and a completion that return have reached it:
// the replica answers GET with the record as soon as the call returns.
func TestWaitReplicaHasTheRecord(t *testing.T) {
	ctx := context.Background()
	master, err := testserver.StartRedisWithArgs("--repl-diskless-sync-delay", "0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = master.Close() })
	replica, err := testserver.StartRedisReplica(master)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = replica.Close() })
	client := goredis.NewClient(&goredis.Options{Addr: master.Addr})
	t.Cleanup(func() { _ = client.Close() })
	rclient := goredis.NewClient(&goredis.Options{Addr: replica.Addr})
	t.Cleanup(func() { _ = rclient.Close() })
	store := newStore(t, client, redis.Config{KeyPrefix: "wait:", WaitReplicas: 1})
	// A fresh script cache on the master: the first Complete meets NOSCRIPT.
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		key := "k" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		res, err := store.Claim(ctx, key, "", time.Minute)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("Claim %s = %v, %v", key, res.Outcome, err)
		}
		if n, err := rclient.Exists(ctx, store.RedisKey(key)).Result(); err != nil || n != 1 {
			t.Fatalf("after Claim %s returned, the replica: EXISTS = %d, %v; want 1", key, n, err)
		}
		if err := store.Complete(ctx, res.Claim, []byte("result"), time.Minute); err != nil {
			t.Fatalf("Complete %s: %v", key, err)
		}
		// Byte 2 of a record is its state: 'C' once completed.
		v, err := rclient.Get(ctx, store.RedisKey(key)).Bytes()
		if err != nil || len(v) < 2 || v[1] != 'C' {
			t.Fatalf("after Complete %s returned, the replica holds %q, %v; want a completed record", key, v, err)
		}
	}
}

// The store with WaitReplicas keeps the whole contract, on a master with a
// replica and on a Cluster with a replica per master (pipelines to
// MasterForKey).
func TestConformanceWaitReplicas(t *testing.T) {
	t.Run("master+replica", func(t *testing.T) {
		master, err := testserver.StartRedisWithArgs("--repl-diskless-sync-delay", "0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = master.Close() })
		replica, err := testserver.StartRedisReplica(master)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = replica.Close() })
		client := goredis.NewClient(&goredis.Options{Addr: master.Addr})
		t.Cleanup(func() { _ = client.Close() })
		store := newStore(t, client, redis.Config{WaitReplicas: 1})
		storetest.Run(t, shared(store), waitFeatures)
	})
	t.Run("cluster", func(t *testing.T) {
		cluster, err := testserver.StartRedisClusterWithReplicas(3, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cluster.Close() })
		client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cluster.Addrs})
		t.Cleanup(func() { _ = client.Close() })
		store := newStore(t, client, redis.Config{WaitReplicas: 1})
		storetest.Run(t, shared(store), waitFeatures)
	})
}

// A write that go-redis retried on another connection finds its own record
// (a claim its own token, a completion ErrAlreadyCompleted) and writes
// nothing, so WAIT on that connection would confirm nothing: the store
// re-propagates the record and waits for that. Without a replica it is
// refused; with one it is confirmed.
// waitShortDuration is the lease the conformance suite lets expire with
// WaitReplicas on: longer than the WAIT timeout (1s by default), since a
// claim whose WAIT waits for a slow replica may otherwise find its own lease
// over before the next operation.
const waitShortDuration = 2 * time.Second

var waitFeatures = func() storetest.Features {
	f := features
	f.ShortDuration = waitShortDuration
	return f
}()

func TestWaitRetriedWriteIsConfirmed(t *testing.T) {
	ctx := context.Background()
	check := func(t *testing.T, client goredis.UniversalClient, replicated bool) {
		prefix := fmt.Sprintf("wait-retried-%d:", time.Now().UnixNano())
		plain := newStore(t, client, redis.Config{KeyPrefix: prefix})
		wait := newStore(t, client, redis.Config{KeyPrefix: prefix, WaitReplicas: 1, WaitTimeout: 2 * time.Second})
		first, err := plain.Claim(ctx, "claim", "", time.Minute)
		if err != nil || first.Outcome != dedup.Acquired {
			t.Fatalf("first Claim = %v, %v", first.Outcome, err)
		}
		res, err := wait.ClaimAs(ctx, "claim", first.Claim.Token, time.Minute)
		if replicated {
			if err != nil || res.Outcome != dedup.Acquired {
				t.Errorf("retried Claim with a replica = %v, %v; want Acquired", res.Outcome, err)
			}
		} else if !errors.Is(err, redis.ErrNotReplicated) {
			t.Errorf("retried Claim without a replica = %v, %v; want ErrNotReplicated", res.Outcome, err)
		}

		c, err := plain.Claim(ctx, "complete", "", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := plain.Complete(ctx, c.Claim, nil, time.Minute); err != nil {
			t.Fatal(err)
		}
		err = wait.Complete(ctx, c.Claim, nil, time.Minute)
		if replicated {
			if !errors.Is(err, dedup.ErrAlreadyCompleted) {
				t.Errorf("retried Complete with a replica = %v; want ErrAlreadyCompleted", err)
			}
		} else if !errors.Is(err, redis.ErrNotReplicated) || errors.Is(err, dedup.ErrClaimLost) {
			t.Errorf("retried Complete without a replica = %v; want ErrNotReplicated, not ErrClaimLost", err)
		}
	}
	t.Run("no replica", func(t *testing.T) { check(t, newClient(t), false) })
	t.Run("replica", func(t *testing.T) {
		master, err := testserver.StartRedisWithArgs("--repl-diskless-sync-delay", "0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = master.Close() })
		replica, err := testserver.StartRedisReplica(master)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = replica.Close() })
		client := goredis.NewClient(&goredis.Options{Addr: master.Addr})
		t.Cleanup(func() { _ = client.Close() })
		check(t, client, true)
	})
}
