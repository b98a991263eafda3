package redis_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/poll"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// watchGoroutines counts the goroutines of the store's subscriptions.
func watchGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "stores/redis.(*subGroup)") || strings.Contains(g, "stores/redis.(*subscriber)") {
			count++
		}
	}
	return count
}

// keyOn returns a key (of scope "watch") whose record lives on master.
func keyOn(t *testing.T, client *goredis.ClusterClient, store *redis.Store, master *testserver.Redis) string {
	t.Helper()
	for i := range 1000 {
		key := fmt.Sprint("k", i)
		c, err := client.MasterForKey(context.Background(), store.RedisKey("watch:"+key))
		if err != nil {
			t.Fatal(err)
		}
		if c.Options().Addr == master.Addr {
			return key
		}
	}
	t.Fatalf("no key on %s", master.Addr)
	return ""
}

// On a Cluster, copies wait for keys on two masters; one master is failed
// over by hand (CLUSTER FAILOVER: it becomes a replica, its slots move),
// the other is killed and its replica promoted by the cluster. Each holder
// then completes on the new master, and every copy answers it (there is no
// fallback poll in this test): the announcement is published in the
// record's slot, and the subscriptions follow the slots to their new
// masters. Afterwards the store's goroutines and pub/sub connections are
// gone.
func TestClusterWaitersSurviveFailovers(t *testing.T) {
	for _, autoPipeline := range []bool{false, true} {
		t.Run(fmt.Sprintf("AutoPipeline=%v", autoPipeline), func(t *testing.T) { clusterWaitersSurviveFailovers(t, autoPipeline) })
	}
}

func clusterWaitersSurviveFailovers(t *testing.T, autoPipeline bool) {
	cluster, client := failoverCluster(t)
	store := newStore(t, client, redis.Config{KeyPrefix: watchPrefix("watch-cl"), AutoPipeline: autoPipeline})
	masters, err := cluster.Masters()
	if err != nil {
		t.Fatal(err)
	}
	if len(masters) != 3 {
		t.Fatalf("%d masters, want 3", len(masters))
	}
	e := waitEngine(t, store)
	manualKey, killKey := keyOn(t, client, store, masters[0]), keyOn(t, client, store, masters[1])
	manual := holdAndWait(t, e, store, manualKey, 2)
	killed := holdAndWait(t, e, store, killKey, 2)
	for _, k := range []struct {
		key    string
		master *testserver.Redis
	}{{manualKey, masters[0]}, {killKey, masters[1]}} {
		node := goredis.NewClient(&goredis.Options{Addr: k.master.Addr})
		poll.Wait(t, time.Minute, "the subscription of "+k.key, func() bool { return shardSubscribers(t, node, store, k.key) == 1 })
		_ = node.Close()
	}

	replica, err := cluster.ReplicaOf(masters[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.Failover(replica, 40*time.Second); err != nil {
		t.Fatal(err)
	}
	if errs := manual.wait(t); len(errs) > 0 {
		t.Fatalf("after the manual failover: %v", errors.Join(errs...))
	}

	replica, err = cluster.ReplicaOf(masters[1])
	if err != nil {
		t.Fatal(err)
	}
	// Replication is asynchronous: a record the replica has not received
	// when its master dies is gone (what Config.WaitReplicas is for, not
	// what this test is about), and a waiting copy would then claim the
	// key and run the work. That happened once, in a run of the whole
	// suite with more packages at once than cores: the only way a copy
	// runs the work here is a new master without the holder's record.
	node := goredis.NewClient(&goredis.Options{Addr: masters[1].Addr})
	acked, err := node.Do(context.Background(), "WAIT", 1, 20000).Int()
	_ = node.Close()
	if err != nil || acked < 1 {
		t.Fatalf("the replica of %s acknowledged the holder's record: %d, %v; want 1", masters[1].Addr, acked, err)
	}
	if err := masters[1].Kill(); err != nil {
		t.Fatal(err)
	}
	if err := cluster.WaitPromoted(replica, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if errs := killed.wait(t); len(errs) > 0 {
		t.Fatalf("after the master was killed: %v", errors.Join(errs...))
	}

	_ = store.Close()
	poll.Wait(t, time.Minute, "the store's goroutines to end", func() bool { return watchGoroutines() == 0 })
	for _, n := range cluster.Nodes {
		if n == masters[1] {
			continue // killed
		}
		poll.Wait(t, time.Minute, "no pub/sub connection on "+n.Addr, func() bool { return pubsubClients(t, n.Addr) == 0 })
	}
}

// A test that ends with a watch open and its store not closed (as one that
// fails halfway does) leaves no goroutine of the store behind: newStore
// closes the store after the test, so a later test that counts the
// store's goroutines (as TestClusterWaitersSurviveFailovers does) counts
// only its own.
func TestNewStoreClosedAfterTheTest(t *testing.T) {
	client := goredis.NewClient(&goredis.Options{Addr: server.Addr})
	t.Cleanup(func() { _ = client.Close() })
	t.Run("leaves a watch open", func(t *testing.T) {
		store := newStore(t, client, redis.Config{KeyPrefix: watchPrefix("watch-left")})
		if _, _, err := store.WatchKey(context.Background(), "watch:left-open", time.Now()); err != nil {
			t.Fatal(err)
		}
		poll.Wait(t, time.Minute, "the store's goroutines to start", func() bool { return watchGoroutines() > 0 })
	})
	poll.Wait(t, time.Minute, "the store's goroutines to end after the test", func() bool { return watchGoroutines() == 0 })
}
