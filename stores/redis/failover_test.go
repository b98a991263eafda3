package redis_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// failoverLease is the claims' lease in the failover tests: longer than a
// failover here (a few seconds, including, with WaitReplicas, the time the
// promoted master has no replica and refuses to confirm completions), so a
// claim taken just before it normally outlives it. A claim whose Complete
// still finds its lease over is counted apart (leaseLost): a copy may then
// legitimately run the effect again, as after any outage longer than the
// lease.
const failoverLease = 15 * time.Second

// failoverWorkers is how many goroutines deliver messages at once.
const failoverWorkers = 4

// failoverRun delivers messages to a store while servers fail over, the way
// a consumer does: each message is claimed, its effect counted, and
// completed; a claim the store refuses (an error) is delivered again, as a
// nacked message is; a Complete that fails is retried, as the engine does.
type failoverRun struct {
	store *redis.Store
	lease time.Duration

	mu        sync.Mutex
	effects   map[string]int  // effects run per key
	leaseLost map[string]bool // keys whose Complete found the claim lost

	next          atomic.Int64 // keys handed out
	handled       atomic.Int64 // deliveries acked
	refused       atomic.Int64 // Claim errors (the delivery was retried)
	notReplicated atomic.Int64 // of which ErrNotReplicated
	retries       atomic.Int64 // Complete errors (Complete was retried)
}

// failoverCounts is what a run measured.
type failoverCounts struct {
	keys, effects, doubled, lost, leaseLost, refused, notReplicated, retries int64
	doubledKeys                                                              []string
}

func (c failoverCounts) String() string {
	return fmt.Sprintf("%d keys, %d effects, %d doubled, %d lost, %d lease-lost completes, "+
		"%d refused claims (%d ErrNotReplicated), %d retried completes",
		c.keys, c.effects, c.doubled, c.lost, c.leaseLost, c.refused, c.notReplicated, c.retries)
}

// pause is the redelivery backoff; it returns false once ctx is done.
func pause(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(10 * time.Millisecond):
		return true
	}
}

// deliver handles one delivery of key until it is acked, or ctx ends.
func (r *failoverRun) deliver(ctx context.Context, key string) error {
	for {
		res, err := r.store.Claim(ctx, key, "", r.lease)
		if err != nil {
			r.refused.Add(1)
			if errors.Is(err, redis.ErrNotReplicated) {
				r.notReplicated.Add(1)
			}
			if !pause(ctx) {
				return fmt.Errorf("a delivery of %s was never acked: the last claim failed with %v", key, err)
			}
			continue
		}
		switch res.Outcome {
		case dedup.Duplicate:
			r.handled.Add(1)
			return nil
		case dedup.InProgress:
			if !pause(ctx) {
				return fmt.Errorf("a delivery of %s was never acked: the key stayed in progress", key)
			}
			continue
		case dedup.Acquired:
		default:
			return fmt.Errorf("claim of %s: unexpected outcome %v", key, res.Outcome)
		}
		r.mu.Lock()
		r.effects[key]++
		r.mu.Unlock()
		for {
			err := r.store.Complete(ctx, res.Claim, []byte("done"), time.Minute)
			if err == nil || errors.Is(err, dedup.ErrAlreadyCompleted) {
				r.handled.Add(1)
				return nil
			}
			if errors.Is(err, dedup.ErrClaimLost) {
				r.mu.Lock()
				r.leaseLost[key] = true
				r.mu.Unlock()
				r.handled.Add(1)
				return nil
			}
			r.retries.Add(1)
			if !pause(ctx) {
				return fmt.Errorf("the completion of %s never succeeded: %v", key, err)
			}
		}
	}
}

// runFailover delivers fresh keys (each twice: the message and an immediate
// duplicate) from failoverWorkers goroutines; after 200 keys it runs each
// event in turn (a failover, waited for), letting 200 more keys through
// after each; then it stops, delivers every key once more (duplicates that
// now meet the promoted replicas), and counts.
//
// An event gets flow, which waits (at most 20 s) until 200 more deliveries
// are acked or 8 more claims or completions failed: traffic that a paused
// replica misses.
func runFailover(t *testing.T, store *redis.Store, events ...func(flow func() error) error) failoverCounts {
	t.Helper()
	return runFailoverWith(t, store, failoverOptions{}, events...)
}

// failoverOptions change runFailover's traffic.
type failoverOptions struct {
	workers int                  // delivering goroutines; failoverWorkers when 0
	keyOf   func(i int64) string // the i-th message's key; "failover-%06d" when nil
	lease   time.Duration        // the claims' lease; failoverLease when 0
}

// runFailoverWith is runFailover with opts.
func runFailoverWith(t *testing.T, store *redis.Store, opts failoverOptions, events ...func(flow func() error) error) failoverCounts {
	t.Helper()
	r := &failoverRun{store: store, lease: opts.lease, effects: map[string]int{}, leaseLost: map[string]bool{}}
	if r.lease == 0 {
		r.lease = failoverLease
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	keyOf := opts.keyOf
	if keyOf == nil {
		keyOf = func(i int64) string { return fmt.Sprintf("failover-%06d", i) }
	}
	workers := opts.workers
	if workers == 0 {
		workers = failoverWorkers
	}

	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 2*workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				key := keyOf(r.next.Add(1) - 1)
				for copy := 0; copy < 2; copy++ {
					if err := r.deliver(ctx, key); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	progress := func(what string, n int64) {
		t.Helper()
		target := r.handled.Load() + n
		for r.handled.Load() < target {
			select {
			case err := <-errs:
				stop.Store(true)
				t.Fatalf("while waiting for %s: %v", what, err)
			case <-ctx.Done():
				stop.Store(true)
				t.Fatalf("timed out waiting for %s: %d of %d deliveries acked", what, r.handled.Load(), target)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	flow := func() error {
		acked, failed := r.handled.Load()+200, r.refused.Load()+r.retries.Load()+8
		deadline := time.Now().Add(20 * time.Second)
		for r.handled.Load() < acked && r.refused.Load()+r.retries.Load() < failed {
			if time.Now().After(deadline) {
				return fmt.Errorf("timed out waiting for 200 acked deliveries or 8 failed claims or completions: %d acked, %d refused, %d retried",
					r.handled.Load(), r.refused.Load(), r.retries.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
		return nil
	}
	progress("400 deliveries before the first failover", 400)
	for i, ev := range events {
		if err := ev(flow); err != nil {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("failover %d: %v", i+1, err)
		}
		progress(fmt.Sprintf("400 deliveries after failover %d", i+1), 400)
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// Every key once more, from the same number of goroutines.
	n := r.next.Load()
	var idx atomic.Int64
	sweepErrs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := idx.Add(1) - 1; i < n; i = idx.Add(1) - 1 {
				if err := r.deliver(ctx, keyOf(i)); err != nil {
					sweepErrs <- fmt.Errorf("redelivering every key after the failovers: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(sweepErrs)
	for err := range sweepErrs {
		t.Fatal(err)
	}

	c := failoverCounts{keys: n, refused: r.refused.Load(), notReplicated: r.notReplicated.Load(), retries: r.retries.Load()}
	r.mu.Lock()
	defer r.mu.Unlock()
	c.leaseLost = int64(len(r.leaseLost))
	for i := int64(0); i < n; i++ {
		key := keyOf(i)
		e := r.effects[key]
		c.effects += int64(e)
		switch {
		case e == 0:
			c.lost++
			t.Errorf("%s: every delivery was acked but its effect never ran", key)
		case e > 1 && !r.leaseLost[key]:
			c.doubled++
			c.doubledKeys = append(c.doubledKeys, key)
		}
	}
	sort.Strings(c.doubledKeys)
	if got, want := r.handled.Load(), 3*n; got != want {
		t.Errorf("%d deliveries acked, want %d (3 per key): a message was lost or acked twice", got, want)
	}
	return c
}

// failoverStore returns a store on client, with or without the WAIT option
// and Config.AutoPipeline.
func failoverStore(t *testing.T, client goredis.UniversalClient, wait, autoPipeline bool) *redis.Store {
	t.Helper()
	cfg := redis.Config{KeyPrefix: "failover:", AutoPipeline: autoPipeline}
	if wait {
		cfg.WaitReplicas, cfg.WaitTimeout = 1, time.Second
	}
	return newStore(t, client, cfg)
}

// failoverVariants are the store configurations the failover tests run
// with: Config.WaitReplicas and Config.AutoPipeline, each alone (the two
// cannot be combined).
var failoverVariants = []failoverVariant{{false, false}, {false, true}, {true, false}}

type failoverVariant struct{ wait, autoPipeline bool }

func (v failoverVariant) name() string {
	return fmt.Sprintf("WaitReplicas=%v,AutoPipeline=%v", v.wait, v.autoPipeline)
}

// checkFailoverCounts logs the counts and, with the option on, fails on any
// doubled effect. With it off a double is possible (a record acknowledged by
// the old master and not yet replicated) but not certain on loopback, so it
// is only reported.
func checkFailoverCounts(t *testing.T, wait bool, c failoverCounts) {
	t.Helper()
	t.Logf("WaitReplicas=%v: %v", wait, c)
	if wait && c.doubled > 0 {
		t.Errorf("with WaitReplicas, %d keys had their effect run twice (not explained by a lost lease), first: %v",
			c.doubled, c.doubledKeys[:min(10, len(c.doubledKeys))])
	}
}

// A master and a replica behind a Sentinel (down-after 500 ms): messages
// flow, the replication link is cut (testserver.CutReplication) while some
// more go through or are refused, the master is SIGKILLed, Sentinel promotes the replica, the
// FailoverClient finds it by itself and the run goes on; the old master is
// started again as the new master's replica. No message is lost;
// with WaitReplicas no effect runs twice.
func TestSentinelFailover(t *testing.T) {
	for _, v := range failoverVariants {
		wait := v.wait
		t.Run(v.name(), func(t *testing.T) {
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
			sentinel, err := testserver.StartRedisSentinelWith(master.Addr, "dedup", testserver.SentinelOptions{
				DownAfter: 500 * time.Millisecond, FailoverTimeout: 2 * time.Second, Replicas: 1,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sentinel.Close() })
			client := goredis.NewFailoverClient(&goredis.FailoverOptions{
				MasterName:    "dedup",
				SentinelAddrs: []string{sentinel.Addr},
				DialTimeout:   250 * time.Millisecond,
				ReadTimeout:   2 * time.Second,
			})
			t.Cleanup(func() { _ = client.Close() })
			store := failoverStore(t, client, wait, v.autoPipeline)
			c := runFailover(t, store, func(flow func() error) error {
				// Writes the replica misses: acknowledged by the master
				// alone without the option, refused by WAIT with it.
				if err := testserver.CutReplication(master, replica); err != nil {
					return err
				}
				if err := flow(); err != nil {
					return err
				}
				if err := master.Kill(); err != nil {
					return err
				}
				if err := testserver.HealReplication(replica); err != nil {
					return err
				}
				if err := sentinel.WaitMaster(replica.Addr, 20*time.Second); err != nil {
					return err
				}
				// The promoted replica has no replica of its own: with
				// WaitReplicas every claim is refused until the old master
				// is back as its replica. It has no persistence, so it must
				// come back as a replica (an empty master would take writes).
				return master.StartAsReplicaOf(replica, 20*time.Second)
			})
			checkFailoverCounts(t, wait, c)
		})
	}
}

// A Redis Cluster of 3 masters with a replica each (node timeout 1 s):
// messages flow while one master is failed over by hand (CLUSTER FAILOVER
// on its replica, which first catches up: nothing can be lost), then while
// another master's replication link is cut, the master killed and its
// replica promoted by the cluster; the killed node is started again and
// rejoins as a replica. The ClusterClient (and, with WaitReplicas, the
// store's pipelines to MasterForKey) follow the new masters by themselves.
// No message is lost; with WaitReplicas no effect runs twice.
func TestClusterFailover(t *testing.T) {
	for _, v := range failoverVariants {
		wait := v.wait
		t.Run(v.name(), func(t *testing.T) {
			cluster, client := failoverCluster(t)
			store := failoverStore(t, client, wait, v.autoPipeline)
			masters, err := cluster.Masters()
			if err != nil {
				t.Fatal(err)
			}
			if len(masters) != 3 {
				t.Fatalf("%d masters, want 3", len(masters))
			}
			manual := func(flow func() error) error {
				replica, err := cluster.ReplicaOf(masters[0])
				if err != nil {
					return err
				}
				return cluster.Failover(replica, 40*time.Second)
			}
			kill := func(flow func() error) error {
				master := masters[1]
				replica, err := cluster.ReplicaOf(master)
				if err != nil {
					return err
				}
				if err := testserver.CutReplication(master, replica); err != nil {
					return err
				}
				if err := flow(); err != nil {
					return err
				}
				return cluster.KillAndPromote(master, replica, 30*time.Second)
			}
			c := runFailover(t, store, manual, kill)
			checkFailoverCounts(t, wait, c)
		})
	}
}

// failoverCluster starts a 3-master Cluster with a replica each (node
// timeout 1s) and a client that gives up on a dead node quickly, both
// closed after the test.
func failoverCluster(t *testing.T) (*testserver.RedisCluster, *goredis.ClusterClient) {
	t.Helper()
	cluster, err := testserver.StartRedisClusterWithReplicas(3, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Close() })
	client := goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs:       cluster.Addrs,
		DialTimeout: 250 * time.Millisecond,
		ReadTimeout: 2 * time.Second,
	})
	t.Cleanup(func() { _ = client.Close() })
	return cluster, client
}
