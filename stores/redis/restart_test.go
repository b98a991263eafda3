package redis_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/poll"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// newOutageClient returns a client that gives up dialling a stopped server
// quickly (one dial per attempt instead of five with 100ms pauses), so that
// the outage tests run fast. Command retries keep go-redis' default (3).
func newOutageClient(addr string) *goredis.Client {
	return goredis.NewClient(&goredis.Options{
		Addr:               addr,
		DialTimeout:        250 * time.Millisecond,
		ReadTimeout:        time.Second,
		DialerRetries:      1,
		DialerRetryTimeout: 10 * time.Millisecond,
	})
}

// outageErrors checks that every operation fails with a store error while
// the server is down: not ErrClaimLost (which would make the middleware drop
// the claim's bookkeeping) and not an outcome.
func outageErrors(t *testing.T, store *redis.Store, c dedup.Claim) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := store.Claim(ctx, "outage-probe", "", time.Minute)
	if err == nil {
		t.Fatalf("Claim while the server is down = %v, want an error", res.Outcome)
	}
	for name, err := range map[string]error{
		"Claim":    err,
		"Complete": store.Complete(ctx, c, nil, time.Minute),
		"Release":  store.Release(ctx, c),
		"Extend":   store.Extend(ctx, c, time.Minute),
	} {
		if err == nil || errors.Is(err, dedup.ErrClaimLost) || errors.Is(err, dedup.ErrInvalidDuration) {
			t.Errorf("%s while the server is down: %v, want a connection error", name, err)
		}
	}
}

// A redis-server that the test owns is shut down and started again while
// claims run. Claims during the outage fail (and are retried, like
// redeliveries); no key is ever reported Acquired twice; the store works again
// by itself once the server is back. The server saves its data set on
// shutdown (CONFIG SET save), as a production server with persistence does.
func TestRestartWhileClaiming(t *testing.T) {
	for _, autoPipeline := range []bool{false, true} {
		t.Run(fmt.Sprintf("AutoPipeline=%v", autoPipeline), func(t *testing.T) { restartWhileClaiming(t, autoPipeline) })
	}
}

func restartWhileClaiming(t *testing.T, autoPipeline bool) {
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
	store := newStore(t, client, redis.Config{AutoPipeline: autoPipeline})

	const (
		workers       = 8
		claimsPerKey  = 3 // each key is claimed by about three workers
		lease         = 10 * time.Minute
		opTimeout     = 2 * time.Second
		progressUnits = 200
	)
	var (
		next, ok, failed atomic.Int64
		stop             = make(chan struct{})
		wg               sync.WaitGroup
		mu               sync.Mutex
		acquired         = map[string]int{}
		violations       []string
	)
	key := func(i int64) string { return fmt.Sprint("restart:", i) }
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stopped() {
				k := key(next.Add(1) / claimsPerKey)
				// Retry the same key until the store answers, like a
				// redelivery of a nacked message.
				var res dedup.ClaimResult
				for {
					cctx, cancel := context.WithTimeout(ctx, opTimeout)
					r, err := store.Claim(cctx, k, "", lease)
					cancel()
					if err == nil {
						res = r
						ok.Add(1)
						break
					}
					failed.Add(1)
					if stopped() {
						return
					}
				}
				if res.Outcome != dedup.Acquired {
					continue
				}
				mu.Lock()
				acquired[k]++
				if acquired[k] > 1 {
					violations = append(violations, k)
				}
				mu.Unlock()
				for !stopped() {
					cctx, cancel := context.WithTimeout(ctx, opTimeout)
					err := store.Complete(cctx, res.Claim, []byte(k), time.Hour)
					cancel()
					if err == nil || errors.Is(err, redis.ErrAlreadyCompleted) {
						break // (the latter: an earlier attempt's reply was lost)
					}
					if errors.Is(err, dedup.ErrClaimLost) {
						mu.Lock()
						violations = append(violations, fmt.Sprintf("%s: Complete: %v", k, err))
						mu.Unlock()
						break
					}
					failed.Add(1)
				}
			}
		}()
	}
	finish := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}
	t.Cleanup(finish)

	poll.Wait(t, time.Minute, "claims before the restart", func() bool { return ok.Load() >= progressUnits })
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	before := failed.Load()
	poll.Wait(t, time.Minute, "claims failing while the server is down", func() bool { return failed.Load() >= before+workers })
	outageErrors(t, store, dedup.Claim{Key: "outage-probe", Token: storekit.NewToken()})

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	after := ok.Load()
	poll.Wait(t, time.Minute, "claims after the restart", func() bool { return ok.Load() >= after+progressUnits })
	finish()

	if len(violations) > 0 {
		t.Fatalf("%d keys acquired twice or lost, first: %s", len(violations), violations[0])
	}
	// Every key claimed so far: none can be acquired again. A claim that
	// fails is asked again, as a redelivery would: go-redis may still
	// answer a dial with the error of the outage for a moment after the
	// server is back (its pool fails dials fast until a background probe
	// connects), which is an error, never an outcome.
	last := next.Load() / claimsPerKey
	var retried atomic.Int64
	for i := int64(0); i <= last; i++ {
		k := key(i)
		var res dedup.ClaimResult
		poll.Wait(t, time.Minute, "a claim of "+k+" after the restart", func() bool {
			r, err := store.Claim(ctx, k, "", lease)
			if err != nil {
				retried.Add(1)
				t.Logf("claim of %s after the restart: %v (asked again)", k, err)
				return false
			}
			res = r
			return true
		})
		if res.Outcome == dedup.Acquired && acquired[k] > 0 {
			t.Fatalf("%s was acquired before the restart and again after it", k)
		}
	}
	t.Logf("%d answered claims, %d failed operations during the outage, %d keys acquired, %d claims asked again after it", ok.Load(), failed.Load(), len(acquired), retried.Load())

	res, err := store.Claim(ctx, "after-restart", "", lease)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("fresh claim after the restart: %v %v", res.Outcome, err)
	}
	if err := store.Complete(ctx, res.Claim, []byte("ok"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if res, err := store.Claim(ctx, "after-restart", "", lease); err != nil || res.Outcome != dedup.Duplicate {
		t.Fatalf("duplicate after the restart: %v %v", res.Outcome, err)
	}
}

// A crash (SIGKILL) of a server without persistence: operations fail while
// it is down, the store recovers by itself, and the restarted server has
// forgotten every record, so a completed key can be acquired again. This is
// Redis' durability, not the store's: README.md says how to configure it.
func TestCrashWithoutPersistenceForgetsRecords(t *testing.T) {
	for _, autoPipeline := range []bool{false, true} {
		t.Run(fmt.Sprintf("AutoPipeline=%v", autoPipeline), func(t *testing.T) { crashWithoutPersistence(t, autoPipeline) })
	}
}

func crashWithoutPersistence(t *testing.T, autoPipeline bool) {
	srv, err := testserver.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	client := newOutageClient(srv.Addr)
	t.Cleanup(func() { _ = client.Close() })
	store := newStore(t, client, redis.Config{AutoPipeline: autoPipeline})
	ctx := context.Background()

	res, err := store.Claim(ctx, "k", "", time.Hour)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("Claim: %v %v", res.Outcome, err)
	}
	if err := store.Complete(ctx, res.Claim, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	outageErrors(t, store, res.Claim)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// The first command after the restart may still meet a connection that
	// died with the old process; go-redis retries it on a new one.
	again, err := store.Claim(ctx, "k", "", time.Hour)
	if err != nil {
		t.Fatalf("Claim after the restart: %v", err)
	}
	if again.Outcome != dedup.Acquired {
		t.Fatalf("Claim after a crash without persistence = %v, want acquired (the record is gone)", again.Outcome)
	}
}
