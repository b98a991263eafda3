package redis_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

// inFlight is a go-redis hook that counts the commands and the pipelines
// of more than one command being sent or awaiting their replies, so that a
// test can strike while a batch is in flight.
type inFlight struct {
	cmds, batches atomic.Int64
}

func (h *inFlight) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *inFlight) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.cmds.Add(1)
		defer h.cmds.Add(-1)
		return next(ctx, cmd)
	}
}
func (h *inFlight) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) > 1 {
			h.batches.Add(1)
			defer h.batches.Add(-1)
		}
		return next(ctx, cmds)
	}
}

// when waits (at most a minute) until a batch is in flight, or with
// autoPipeline false a command, so that what follows strikes it.
func (h *inFlight) when(autoPipeline bool) error {
	deadline := time.Now().Add(time.Minute)
	for {
		if autoPipeline && h.batches.Load() > 0 || !autoPipeline && h.cmds.Load() > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no batch in flight within a minute (autoPipeline %v)", autoPipeline)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// checkExactlyOnce fails the test unless every key's effect ran once: no
// server lost data in these tests, so a double can only come from a claim
// reported won that was not written, or from a write reported lost that
// was done.
func checkExactlyOnce(t *testing.T, c failoverCounts) {
	t.Helper()
	t.Log(c)
	if c.effects != c.keys || c.doubled > 0 || c.leaseLost > 0 {
		t.Errorf("%d effects for %d keys: %d keys had their effect run twice, %d completions found their claim lost; first doubled: %v",
			c.effects, c.keys, c.doubled, c.leaseLost, c.doubledKeys[:min(10, len(c.doubledKeys))])
	}
}

// The store's connections are killed (CLIENT KILL TYPE normal) while
// batches of claims and completions are in flight, ten times, with
// Config.AutoPipeline and without, with go-redis' retries and without
// (MaxRetries -1). With retries, a claim whose reply was lost finds its
// own record when retried (Acquired), a completion its own completed
// record (ErrAlreadyCompleted); without, the store reports an error, the
// message is delivered again, and a claim whose write was done holds the
// key until its lease ends. Every message is acked and every effect runs
// exactly once: no claim is reported won that was not written.
func TestConnectionKilledMidBatch(t *testing.T) {
	for _, v := range []struct {
		autoPipeline bool
		maxRetries   int
	}{{false, 0}, {true, 0}, {false, -1}, {true, -1}} {
		autoPipeline, maxRetries := v.autoPipeline, v.maxRetries
		t.Run(fmt.Sprintf("AutoPipeline=%v,MaxRetries=%d", autoPipeline, maxRetries), func(t *testing.T) {
			srv, err := testserver.StartRedis()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = srv.Close() })
			client := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ReadTimeout: 2 * time.Second, PoolSize: 64, MaxRetries: maxRetries})
			t.Cleanup(func() { _ = client.Close() })
			hook := &inFlight{}
			client.AddHook(hook)
			admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
			t.Cleanup(func() { _ = admin.Close() })
			store := failoverStore(t, client, false, autoPipeline)
			var killed int64
			kill := func(flow func() error) error {
				for range 10 {
					if err := hook.when(autoPipeline); err != nil {
						return err
					}
					n, err := admin.Do(context.Background(), "client", "kill", "type", "normal", "skipme", "yes").Int64()
					if err != nil {
						return err
					}
					killed += n
					if err := flow(); err != nil {
						return err
					}
				}
				return nil
			}
			// A claim whose reply was lost (MaxRetries -1) holds its key until
			// its lease ends: keep that short.
			c := runFailoverWith(t, store, failoverOptions{workers: 32, lease: 5 * time.Second}, kill)
			t.Logf("%d connections killed", killed)
			checkExactlyOnce(t, c)
		})
	}
}

// A slot of a 3-master Cluster, holding every key of the run (a hash tag),
// is migrated to another master and back while claims and completions on
// it are batched, with Config.AutoPipeline and without: during each
// migration the old owner answers ASK for the keys it no longer has, and
// after it MOVED (the client's slot map is stale), each in the middle of
// the client's pipelines. Every message is acked and every effect runs
// exactly once.
func TestMovedDuringBatch(t *testing.T) {
	for _, autoPipeline := range []bool{false, true} {
		t.Run(fmt.Sprintf("AutoPipeline=%v", autoPipeline), func(t *testing.T) {
			cluster, err := testserver.StartRedisCluster(3)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cluster.Close() })
			client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cluster.Addrs, ReadTimeout: 2 * time.Second})
			t.Cleanup(func() { _ = client.Close() })
			hook := &inFlight{}
			client.AddHook(hook)
			store := failoverStore(t, client, false, autoPipeline)
			ctx := context.Background()
			const tag = "{moving}"
			keyOf := func(i int64) string { return tag + strconv.FormatInt(i, 10) }
			slot, err := client.ClusterKeySlot(ctx, store.RedisKey(keyOf(0))).Result()
			if err != nil {
				t.Fatal(err)
			}
			nodes := make([]*goredis.Client, len(cluster.Addrs))
			for i, addr := range cluster.Addrs {
				nodes[i] = goredis.NewClient(&goredis.Options{Addr: addr})
				t.Cleanup(func() { _ = nodes[i].Close() })
			}
			owner := func() (*goredis.Client, error) {
				c, err := client.MasterForKey(ctx, store.RedisKey(keyOf(0)))
				if err != nil {
					return nil, err
				}
				for _, n := range nodes {
					if n.Options().Addr == c.Options().Addr {
						return n, nil
					}
				}
				return nil, fmt.Errorf("no node %s", c.Options().Addr)
			}
			from, err := owner()
			if err != nil {
				t.Fatal(err)
			}
			to := nodes[0]
			if to == from {
				to = nodes[1]
			}
			moved := func(flow func() error) error {
				if err := migrateSlot(ctx, nodes, int(slot), from, to, func() error {
					if err := flow(); err != nil { // ASK while the keys move
						return err
					}
					return hook.when(autoPipeline)
				}); err != nil {
					return err
				}
				return flow() // MOVED to the stale client
			}
			back := func(flow func() error) error {
				if err := hook.when(autoPipeline); err != nil {
					return err
				}
				return migrateSlot(ctx, nodes, int(slot), to, from, flow)
			}
			c := runFailoverWith(t, store, failoverOptions{workers: 32, keyOf: keyOf}, moved, back)
			var redirects []string
			for _, n := range nodes {
				info, err := n.Info(ctx, "errorstats").Result()
				if err != nil {
					t.Fatal(err)
				}
				for _, line := range strings.Split(info, "\r\n") {
					if strings.HasPrefix(line, "errorstat_MOVED") || strings.HasPrefix(line, "errorstat_ASK") {
						redirects = append(redirects, n.Options().Addr+" "+line)
					}
				}
			}
			t.Logf("redirections answered: %v", redirects)
			if !strings.Contains(strings.Join(redirects, " "), "MOVED") {
				t.Errorf("no MOVED was answered: the slot's move was never seen by the client")
			}
			checkExactlyOnce(t, c)
		})
	}
}

// migrateSlot moves slot from one master to another the way redis-cli
// --cluster reshard does: the target imports it, the source migrates it,
// during (called once the slot is in that state) runs, the keys move with
// MIGRATE in batches, and every master learns the new owner.
func migrateSlot(ctx context.Context, masters []*goredis.Client, slot int, from, to *goredis.Client, during func() error) error {
	fromID, err := from.ClusterMyID(ctx).Result()
	if err != nil {
		return err
	}
	toID, err := to.ClusterMyID(ctx).Result()
	if err != nil {
		return err
	}
	if err := to.Do(ctx, "cluster", "setslot", slot, "importing", fromID).Err(); err != nil {
		return err
	}
	if err := from.Do(ctx, "cluster", "setslot", slot, "migrating", toID).Err(); err != nil {
		return err
	}
	if err := during(); err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(to.Options().Addr)
	if err != nil {
		return err
	}
	for {
		keys, err := from.ClusterGetKeysInSlot(ctx, slot, 100).Result()
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := from.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("MIGRATE %d keys: %w", len(keys), err)
		}
	}
	// The target first, then the source, then the others (as redis-cli).
	for _, n := range append([]*goredis.Client{to, from}, masters...) {
		if err := n.Do(ctx, "cluster", "setslot", slot, "node", toID).Err(); err != nil {
			return err
		}
	}
	return nil
}

// A coordinated Cluster failover (CLUSTER FAILOVER on a replica, which
// first catches up with its master) while claims and completions are
// batched, with Config.AutoPipeline and without, on each of the three
// masters in turn: nothing acknowledged is lost, so, unlike after a crash
// of a master (TestClusterFailover), every effect runs exactly once
// without Config.WaitReplicas, which cannot be combined with
// Config.AutoPipeline.
func TestClusterManualFailoverDuringBatch(t *testing.T) {
	for _, autoPipeline := range []bool{false, true} {
		t.Run(fmt.Sprintf("AutoPipeline=%v", autoPipeline), func(t *testing.T) {
			cluster, client := failoverCluster(t)
			hook := &inFlight{}
			client.AddHook(hook)
			store := failoverStore(t, client, false, autoPipeline)
			masters, err := cluster.Masters()
			if err != nil {
				t.Fatal(err)
			}
			failover := func(i int) func(flow func() error) error {
				return func(flow func() error) error {
					replica, err := cluster.ReplicaOf(masters[i])
					if err != nil {
						return err
					}
					if err := hook.when(autoPipeline); err != nil {
						return err
					}
					if err := cluster.Failover(replica, 40*time.Second); err != nil {
						return err
					}
					return flow()
				}
			}
			c := runFailoverWith(t, store, failoverOptions{workers: 32}, failover(0), failover(1), failover(2))
			checkExactlyOnce(t, c)
		})
	}
}
