package linear

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// redisParams: go-redis resends a command whose reply was lost (MaxRetries).
var redisParams = params{retries: true}

func newRedisStore(t testing.TB, config redis.Config) *redis.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := redis.New(ctx, config)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func redisClient(t testing.TB, addr string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr, DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// restartWitness is a nemesis step around a restart: a witness claims and
// completes a key of its own, restart runs, and the witness claims the key
// again. With the record kept, that claim finds it (Duplicate); a store
// that lost it answers Acquired, which porcupine refuses. It returns the
// second claim's outcome.
func restartWitness(rec *recorder, tg target, key string, restart func() error) (dedup.Outcome, error) {
	w := rec.newClient(tg, 3*time.Second)
	done, err := w.completeFresh(key)
	if err != nil {
		return 0, err
	}
	if err := restart(); err != nil {
		return 0, err
	}
	res, err := w.claimUntilAnswered(done, time.Minute, 20*time.Second)
	if err != nil {
		return 0, fmt.Errorf("the witness's claim after the restart: %w", err)
	}
	return res.Outcome, nil
}

// killRestart runs two SIGKILL-and-restart rounds of srv, each with a
// witness, and reports the witnesses' second outcomes.
func killRestart(srv *testserver.Redis, tg target, prefix string, outcomes *[]dedup.Outcome, firstKill *int64) nemesis {
	return func(t *testing.T, rec *recorder) error {
		for i := 0; i < rounds(2); i++ {
			time.Sleep(1200 * time.Millisecond)
			o, err := restartWitness(rec, tg, fmt.Sprintf("%switness-%d", prefix, i), func() error {
				if i == 0 {
					*firstKill = rec.now()
				}
				if err := srv.Kill(); err != nil {
					return err
				}
				time.Sleep(time.Second) // clients meet a dead server: some calls fail
				return srv.Start()
			})
			if err != nil {
				return err
			}
			*outcomes = append(*outcomes, o)
		}
		return nil
	}
}

// TestLinearRedis: the Redis store's histories under faults. With AOF
// (appendfsync always) a SIGKILLed and restarted server keeps every
// acknowledged record, with the default store and the auto-pipelined one;
// without persistence the restart loses records and porcupine shows it;
// through toxiproxy, latency and connection resets either way lose replies
// (recorded as pending), which go-redis resends.
func TestLinearRedis(t *testing.T) {
	t.Parallel()
	for _, v := range []struct {
		name        string
		args        []string // redis-server arguments; none: no persistence
		pipelined   bool
		wantAnomaly bool
	}{
		{name: "aof-always/sigkill", args: []string{"--appendonly", "yes", "--appendfsync", "always"}},
		{name: "aof-always/sigkill/auto-pipeline", args: []string{"--appendonly", "yes", "--appendfsync", "always"}, pipelined: true},
		{name: "no-persistence/sigkill", wantAnomaly: true},
	} {
		t.Run(v.name, func(t *testing.T) {
			srv, err := testserver.StartRedisWithArgs(v.args...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = srv.Close() })
			tg := newTarget(newRedisStore(t, redis.Config{Client: redisClient(t, srv.Addr), AutoPipeline: v.pipelined}))
			tg.retries = true
			w := defaultWorkload("linear:redis:")
			w.Duration = time.Minute // the nemesis ends the run
			w.MaxOps = 1 << 20
			var outcomes []dedup.Outcome
			var killed int64
			ops := runScenario(t, w, tg, 11, time.Second, killRestart(srv, tg, "linear:redis:", &outcomes, &killed))
			t.Logf("the witnesses' claims after each restart: %v", outcomes)
			if v.wantAnomaly {
				requireAnomaly(t, ops, redisParams)
				t.Log("the history up to the first kill:")
				requireLinearizable(t, before(ops, killed), redisParams)
				return
			}
			requireLinearizable(t, ops, redisParams)
			for _, o := range outcomes {
				if o != dedup.Duplicate {
					t.Errorf("a witness's claim after the restart found %v, want duplicate (AOF keeps the record)", o)
				}
			}
		})
	}
	for _, pipelined := range []bool{false, true} {
		name := "toxiproxy"
		if pipelined {
			name += "/auto-pipeline"
		}
		t.Run(name, func(t *testing.T) {
			srv, err := testserver.StartRedis()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = srv.Close() })
			proxy := newFaultProxy(t, "redis", srv.Addr)
			tg := newTarget(newRedisStore(t, redis.Config{Client: redisClient(t, proxy.Addr()), AutoPipeline: pipelined}))
			tg.retries = true
			w := defaultWorkload("linear:redis-proxy:")
			w.Duration = time.Minute
			w.MaxOps = 1 << 20
			var counts toxicCounts
			ops := runScenario(t, w, tg, 13, time.Second, proxyFaults(proxy, rounds(8), &counts))
			t.Logf("faults: %s", &counts)
			requireLinearizable(t, ops, redisParams)
		})
	}
}

// quietLog discards go-redis' own log lines ("failed to dial" while a
// server is down, by the hundred): the history says what happened.
type quietLog struct{}

func (quietLog) Printf(context.Context, string, ...interface{}) {}

func init() { goredis.SetLogger(quietLog{}) }

// TestLinearRedisClusterFailover: a 3-master Cluster with a replica each.
// One master's replication link is cut while the clients run and a witness
// claims and completes a key of that master's; the master is SIGKILLed and
// its replica promoted. Without WaitReplicas the promoted replica lacks
// what its master acknowledged alone, and porcupine shows the lost claims
// and completions; with WaitReplicas those writes were refused
// (ErrNotReplicated: pending in the history), and the history is
// linearizable. A Release does not wait for the replicas (documented: a
// lost release only delays the next copy until the lease ends), so the
// model lets an acknowledged release be undone there.
func TestLinearRedisClusterFailover(t *testing.T) {
	t.Parallel()
	for _, wait := range []bool{true, false} {
		name := "wait-replicas"
		if !wait {
			name = "no-wait"
		}
		t.Run(name, func(t *testing.T) {
			cluster, err := testserver.StartRedisClusterWithReplicas(3, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cluster.Close() })
			client := goredis.NewClusterClient(&goredis.ClusterOptions{
				Addrs: cluster.Addrs, DialTimeout: 250 * time.Millisecond, ReadTimeout: 2 * time.Second,
			})
			t.Cleanup(func() { _ = client.Close() })
			config := redis.Config{Client: client}
			if wait {
				config.WaitReplicas = 1
			}
			tg := newTarget(newRedisStore(t, config))
			tg.retries = true
			masters, err := cluster.Masters()
			if err != nil {
				t.Fatal(err)
			}
			master := masters[1]
			replica, err := cluster.ReplicaOf(master)
			if err != nil {
				t.Fatal(err)
			}
			prefix := "linear:cluster-" + name + ":"
			witness := keyOn(t, client, master, prefix+"witness-")
			w := defaultWorkload(prefix)
			w.Duration = 2 * time.Minute
			w.MaxOps = 1 << 20
			var cut int64
			var outcome dedup.Outcome
			ops := runScenario(t, w, tg, 17, time.Second, func(t *testing.T, rec *recorder) error {
				time.Sleep(1200 * time.Millisecond)
				cut = rec.now()
				if err := testserver.CutReplication(master, replica); err != nil {
					return err
				}
				wc := rec.newClient(tg, 3*time.Second)
				if !wait {
					// Without WaitReplicas the master alone acknowledges
					// the witness's claim and completion.
					if witness, err = wc.completeFresh(witness); err != nil {
						return err
					}
				} else if res, known := wc.claim(witness, "fp-a", time.Minute); known && res.Outcome == dedup.Acquired {
					wc.finish(step{Kind: opComplete, Result: "witness", Retention: time.Minute}, res.Claim)
				}
				time.Sleep(time.Second) // the clients write to the cut master meanwhile
				// The old master rejoins as the new one's replica (with
				// WaitReplicas no claim is acknowledged without one).
				if err := cluster.KillAndPromote(master, replica, 30*time.Second); err != nil {
					return err
				}
				res, err := wc.claimUntilAnswered(witness, time.Minute, 20*time.Second)
				if err != nil {
					return fmt.Errorf("the witness's claim after the failover: %w", err)
				}
				outcome = res.Outcome
				return nil
			})
			t.Logf("the witness's claim after the failover: %v", outcome)
			p := redisParams
			if wait {
				p.lostRelease = true
				// ClaimBatch with WaitReplicas claims the records
				// concurrently: two records of one key in one batch are
				// not decided in request order.
				p.batchAnyOrder = true
				requireLinearizable(t, ops, p)
				return
			}
			requireAnomaly(t, ops, p)
			if outcome != dedup.Acquired {
				t.Errorf("the witness's claim after the failover found %v, want acquired (its record was lost)", outcome)
			}
			t.Log("the history up to the cut:")
			requireLinearizable(t, before(ops, cut), p)
		})
	}
}

// keyOn returns a scoped key, beginning with base, whose record lives on
// master.
func keyOn(t testing.TB, client *goredis.ClusterClient, master *testserver.Redis, base string) string {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < 1000; i++ {
		key := fmt.Sprintf("%s{%d}", base, i) // completeFresh's variants of the key share its slot
		node, err := client.MasterForKey(ctx, redis.DefaultKeyPrefix+key)
		if err != nil {
			t.Fatal(err)
		}
		if node.Options().Addr == master.Addr {
			return key
		}
	}
	t.Fatalf("no key of %s on %s", base, master.Addr)
	return ""
}
