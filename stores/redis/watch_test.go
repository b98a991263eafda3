package redis_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/poll"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// countedStore counts claims; embedding keeps the store's WatchKey, so the
// engine still sees a store that wakes waiters (dedup.KeyWatcher).
type countedStore struct {
	*redis.Store
	claims atomic.Int64
}

func (s *countedStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, key, fp, lease)
	s.claims.Add(1) // once answered
	return res, err
}

// watchRuns numbers the stores of the watch tests, so that a test run
// again on the shared server (-count) meets none of its earlier keys.
var watchRuns atomic.Int64

// watchPrefix returns a key prefix of its own for a test's store.
func watchPrefix(name string) string { return fmt.Sprintf("%s-%d:", name, watchRuns.Add(1)) }

// noFallback is an InProgressFallback no test outlives: a waiter that
// answers was woken by the store, not by the fallback poll.
const noFallback = time.Hour

// waitEngine returns an engine whose waits are woken by store only.
func waitEngine(t *testing.T, store dedup.Store) *dedup.Engine {
	t.Helper()
	e, err := dedup.NewEngine(dedup.Config{Store: store, InProgressWait: 5 * time.Minute, InProgressFallback: noFallback,
		Lease: 5 * time.Minute, CompleteRetries: 20, CompleteBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// waitRun is a holder of a key and copies waiting for it.
type waitRun struct {
	released chan struct{}
	once     sync.Once
	holder   chan error
	answers  chan error
	n        int

	holderErr  error
	holderSeen bool
}

// holdAndWait runs a holder of key on e (whose work blocks until release,
// then succeeds with "done") and n copies that wait for it; it returns
// once the holder runs and every copy has a watch open.
func holdAndWait(t *testing.T, e *dedup.Engine, store *redis.Store, key string, n int) *waitRun {
	t.Helper()
	call := dedup.Call{Scope: "watch", Key: key}
	r := &waitRun{released: make(chan struct{}), holder: make(chan error, 1), answers: make(chan error, n), n: n}
	entered := make(chan struct{})
	go func() {
		_, err := e.Do(context.Background(), call, func(context.Context) ([]byte, error) {
			close(entered)
			<-r.released
			return []byte("done"), nil
		})
		r.holder <- err
	}()
	recvWithin(t, "the holder to run", entered)
	before := redis.OpenWatches(store)
	for range n {
		go func() {
			res, err := e.Do(context.Background(), call, func(context.Context) ([]byte, error) {
				return nil, errors.New("a waiting copy ran the work")
			})
			if err == nil && (res.Outcome != dedup.Duplicate || string(res.Result) != "done") {
				err = fmt.Errorf("copy: %v %q, want the holder's duplicate", res.Outcome, res.Result)
			}
			r.answers <- err
		}()
	}
	poll.Wait(t, time.Minute, "every copy to watch the key", func() bool { return redis.OpenWatches(store) >= before+n })
	return r
}

// release lets the holder's work end.
func (r *waitRun) release() { r.once.Do(func() { close(r.released) }) }

// holderDone releases the holder and waits for its answer.
func (r *waitRun) holderDone(t *testing.T) error {
	t.Helper()
	r.release()
	if !r.holderSeen {
		r.holderErr, r.holderSeen = recvWithin(t, "the holder", r.holder), true
	}
	return r.holderErr
}

// wait releases the holder and collects every answer (bounded).
func (r *waitRun) wait(t *testing.T) []error {
	t.Helper()
	var errs []error
	if err := r.holderDone(t); err != nil {
		errs = append(errs, fmt.Errorf("holder: %w", err))
	}
	for range r.n {
		if err := recvWithin(t, "a waiting copy", r.answers); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// recvWithin receives from ch within two minutes, or fails the test.
func recvWithin[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(2 * time.Minute):
		t.Fatalf("waited two minutes for %s", what)
		panic("unreachable")
	}
}

// shardSubscribers returns how many subscribers the server counts on the
// shard channel of key's record.
func shardSubscribers(t *testing.T, c goredis.UniversalClient, store *redis.Store, key string) int64 {
	t.Helper()
	ch := store.RedisKey("watch:" + key)
	n, err := c.PubSubShardNumSub(context.Background(), ch).Result()
	if err != nil {
		t.Fatalf("PUBSUB SHARDNUMSUB: %v", err)
	}
	return n[ch]
}

// pubsubClients returns how many pub/sub connections addr has.
func pubsubClients(t *testing.T, addr string) int {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	list, err := c.Do(context.Background(), "client", "list", "type", "pubsub").Text()
	if err != nil {
		t.Fatalf("CLIENT LIST TYPE pubsub: %v", err)
	}
	return strings.Count(list, "\n")
}

// noLeaks waits (bounded) until the process is back to baseline goroutines
// and every addr has no pub/sub connection.
func noLeaks(t *testing.T, baseline int, addrs ...string) {
	t.Helper()
	poll.Wait(t, time.Minute, fmt.Sprintf("goroutines back to %d", baseline), func() bool { return runtime.NumGoroutine() <= baseline })
	for _, addr := range addrs {
		poll.Wait(t, time.Minute, "no pub/sub connection on "+addr, func() bool { return pubsubClients(t, addr) == 0 })
	}
}

// The completing and releasing scripts announce the change on the shard
// channel named like the record's key; a watch is woken once when its
// subscription is in place, then by each announcement.
func TestWatchWokenByCompleteAndRelease(t *testing.T) {
	client := newClient(t)
	store := newStore(t, client, redis.Config{KeyPrefix: watchPrefix("watch-ann")})
	defer store.Close()
	ctx := context.Background()
	for _, op := range []string{"complete", "release"} {
		key := "k-" + op
		res, err := store.Claim(ctx, key, "", time.Minute)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("claim: %v %v", res.Outcome, err)
		}
		wake, stop, err := store.WatchKey(ctx, key, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		recvWithin(t, "the wake of the subscription in place", wake)
		if op == "complete" {
			err = store.Complete(ctx, res.Claim, nil, time.Minute)
		} else {
			err = store.Release(ctx, res.Claim)
		}
		if err != nil {
			t.Fatal(err)
		}
		recvWithin(t, "the wake of the "+op, wake)
		stop()
	}
}

// Ten copies wait for a holder; they answer its completion (a duplicate
// with its result) woken by the announcement, with no fallback poll to
// fall back on, through one subscription; the connection and its
// goroutines are gone after Close.
func TestWaitersWokenByTheCompletion(t *testing.T) {
	client := newClient(t)
	client.Ping(context.Background())
	store := newStore(t, client, redis.Config{KeyPrefix: watchPrefix("watch-ten")})
	baseline := runtime.NumGoroutine()
	counted := &countedStore{Store: store}
	e := waitEngine(t, counted)
	run := holdAndWait(t, e, store, "ten", 10)
	poll.Wait(t, time.Minute, "the subscription", func() bool { return shardSubscribers(t, client, store, "ten") == 1 })
	if errs := run.wait(t); len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
	// Each copy: its first claim, at most one when its watch came into
	// place, one when woken.
	if n := counted.claims.Load(); n > 1+3*10 {
		t.Errorf("%d claims for one holder and ten copies, want at most 31", n)
	}
	_ = store.Close()
	noLeaks(t, baseline, server.Addr)
}

// A forged announcement (or a late one) costs the waiter a claim, never
// an effect: it claims, finds the key still in progress and waits on,
// then answers the real completion.
func TestForgedAnnouncementCostsAClaim(t *testing.T) {
	client := newClient(t)
	store := newStore(t, client, redis.Config{KeyPrefix: watchPrefix("watch-forged")})
	defer store.Close()
	counted := &countedStore{Store: store}
	e := waitEngine(t, counted)
	run := holdAndWait(t, e, store, "forged", 1)
	// Holder, copy, and the claim the subscription's confirmation prompts.
	poll.Wait(t, time.Minute, "the copy's claim once subscribed", func() bool { return counted.claims.Load() == 3 })
	ch := store.RedisKey("watch:forged")
	if err := client.SPublish(context.Background(), ch, "completed, honest").Err(); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, time.Minute, "the claim the forged message prompts", func() bool { return counted.claims.Load() == 4 })
	if errs := run.wait(t); len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
	if n := counted.claims.Load(); n != 5 {
		t.Errorf("%d claims, want 5 (holder, copy, subscribed, forged, completed)", n)
	}
}

// The subscription connection is killed while copies wait (CLIENT KILL
// TYPE pubsub) and cannot be dialled again until the holder has completed,
// so the announcement finds no subscriber and is lost. Once the
// connection is back, its keys are subscribed again, which wakes the
// copies: they answer the completion (no fallback poll in this test).
// Nothing leaks.
func TestWaitersSurviveAKilledSubscription(t *testing.T) {
	var refuse atomic.Bool
	client := goredis.NewClient(&goredis.Options{Addr: server.Addr, MaxRetries: -1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if refuse.Load() {
				return nil, errors.New("the test refuses new connections")
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}})
	t.Cleanup(func() { _ = client.Close() })
	client.Ping(context.Background())
	store := newStore(t, client, redis.Config{KeyPrefix: watchPrefix("watch-kill")})
	baseline := runtime.NumGoroutine()
	e := waitEngine(t, store)
	run := holdAndWait(t, e, store, "kill", 3)
	poll.Wait(t, time.Minute, "the subscription", func() bool { return shardSubscribers(t, client, store, "kill") == 1 })
	refuse.Store(true)
	admin := newClient(t)
	killed, err := admin.ClientKillByFilter(context.Background(), "TYPE", "pubsub").Result()
	if err != nil || killed < 1 {
		t.Fatalf("CLIENT KILL TYPE pubsub: %d, %v", killed, err)
	}
	poll.Wait(t, time.Minute, "the subscription to be gone", func() bool { return shardSubscribers(t, admin, store, "kill") == 0 })
	if err := run.holderDone(t); err != nil { // completed through a pooled connection
		t.Fatal(err)
	}
	select {
	case err := <-run.answers:
		t.Fatalf("a copy answered while no subscription could wake it: %v", err)
	default:
	}
	refuse.Store(false)
	if errs := run.wait(t); len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
	_ = store.Close()
	noLeaks(t, baseline, server.Addr)
}

// The server is restarted (its data set saved and loaded) while copies
// wait; the holder's completion, retried until the server is back, wakes
// them through the subscription dialled again. With a short linger the
// idle connection closes by itself: nothing leaks without Close.
func TestWaitersSurviveARestart(t *testing.T) {
	srv, err := testserver.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	client := newOutageClient(srv.Addr)
	t.Cleanup(func() { _ = client.Close() })
	ctx := context.Background()
	if err := client.ConfigSet(ctx, "save", "3600 1").Err(); err != nil {
		t.Fatal(err)
	}
	store := newStore(t, client, redis.Config{KeyPrefix: watchPrefix("watch-restart")})
	redis.SetWatchLinger(store, 50*time.Millisecond)
	baseline := runtime.NumGoroutine()
	e := waitEngine(t, store)
	run := holdAndWait(t, e, store, "restart", 3)
	poll.Wait(t, time.Minute, "the subscription", func() bool { return shardSubscribers(t, client, store, "restart") == 1 })
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	run.release() // Complete fails until the server is back; the engine retries it
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if errs := run.wait(t); len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
	noLeaks(t, baseline, srv.Addr)
}

// A Ring's shard channels cannot be followed: WatchKey refuses, and the
// engine polls.
func TestRingIsNotWatched(t *testing.T) {
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"one": server.Addr}})
	t.Cleanup(func() { _ = ring.Close() })
	store := newStore(t, ring, redis.Config{KeyPrefix: watchPrefix("watch-ring")})
	if _, _, err := store.WatchKey(context.Background(), "k", time.Now()); !errors.Is(err, redis.ErrWatchUnsupported) {
		t.Fatalf("WatchKey on a Ring: %v, want ErrWatchUnsupported", err)
	}
}
