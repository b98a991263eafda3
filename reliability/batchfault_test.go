package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
)

// TestBatchConnectionDroppedMidPipeline: the connection drops after the
// replies of the first three claims of a batch's pipeline (toxiproxy's
// limit_data downstream): Redis ran every claim, but only three were
// answered. Those three run and are completed; the seven others are
// store errors, do not run, and their records, claimed on the server,
// stay in progress no longer than their lease: no record of the batch is
// in progress past its lease.
func TestBatchConnectionDroppedMidPipeline(t *testing.T) {
	eachAutoPipeline(t, batchConnectionDroppedMidPipeline)
}

func batchConnectionDroppedMidPipeline(t *testing.T, autoPipeline bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := uniquePrefix("batchfault")
	rdb := newRedisClient(t, redisServer.Addr)
	proxy := newFaultProxy(t, redisServer.Addr)
	// One connection set up before the fault, no go-redis retries.
	client := goredis.NewClient(&goredis.Options{Addr: proxy.Addr(), MaxRetries: -1, PoolSize: 1, Protocol: 3})
	t.Cleanup(func() { _ = client.Close() })
	store := newRedisStore(t, client, prefix, autoPipeline)
	warm, err := store.Claim(ctx, "warm-up", "", time.Minute) // the connection, and the scripts in the server's cache
	if err != nil {
		t.Fatal(err)
	}
	if errs := store.CompleteBatch(ctx, []dedup.CompleteRequest{{Claim: warm.Claim, Retention: time.Minute}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	const lease = 3 * time.Second
	e, err := dedup.NewEngine(dedup.Config{Store: store, Lease: lease, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var calls []dedup.BatchCall
	for i := range 10 {
		calls = append(calls, dedup.BatchCall{Call: dedup.Call{Scope: "s", Key: fmt.Sprint("ORDER-", i)}})
	}
	// Three RESP3 null replies ("_\r\n") pass, then the connection closes.
	proxy.add(t, "drop", "limit_data", "downstream", map[string]any{"bytes": 9})
	var ran atomic.Int32
	res, errs := e.DoBatch(ctx, dedup.Batch{Calls: calls}, func(ctx context.Context, i int) ([]byte, error) {
		if ran.Add(1) == 1 {
			proxy.remove(t, "drop") // the completions get through
		}
		return []byte("done"), nil
	})
	if ran.Load() != 3 {
		t.Fatalf("ran %d calls, want the 3 answered", ran.Load())
	}
	key := func(i int) string { return prefix + admin.ScopedKey("s", calls[i].Key) }
	var unanswered []string
	for i, r := range res {
		var se *dedup.StoreError
		switch {
		case i < 3 && (errs[i] != nil || r.Outcome != dedup.Acquired):
			t.Fatalf("call %d: %v %v, want acquired", i, r.Outcome, errs[i])
		case i < 3:
			if v, err := rdb.Get(ctx, key(i)).Bytes(); err != nil || redisRecordState(v) != 'C' {
				t.Fatalf("record %d: %q %v, want completed", i, v, err)
			}
		case !errors.As(errs[i], &se):
			t.Fatalf("call %d: %v, want a *StoreError", i, errs[i])
		default:
			unanswered = append(unanswered, key(i))
		}
	}
	// The unanswered claims ran on the server: in progress, within their lease.
	for _, k := range unanswered {
		v, err := rdb.Get(ctx, k).Bytes()
		if err != nil || redisRecordState(v) != 'P' {
			t.Fatalf("record %s: %q %v, want in progress (the claim ran, its reply was lost)", k, v, err)
		}
		if ttl, err := rdb.PTTL(ctx, k).Result(); err != nil || ttl <= 0 || ttl > lease {
			t.Fatalf("record %s: PTTL %v %v, want within the lease %v", k, ttl, err, lease)
		}
	}
	waitFor(t, time.Minute, "the unanswered claims' leases to end", func() bool {
		n, err := rdb.Exists(ctx, unanswered...).Result()
		return err == nil && n == 0
	})
	// A retry of the batch: the three are duplicates, the seven run.
	ran.Store(0)
	res, errs = e.DoBatch(ctx, dedup.Batch{Calls: calls}, func(ctx context.Context, i int) ([]byte, error) {
		ran.Add(1)
		return nil, nil
	})
	for i, r := range res {
		if errs[i] != nil || (i < 3) != (r.Outcome == dedup.Duplicate) {
			t.Fatalf("retry, call %d: %v %v", i, r.Outcome, errs[i])
		}
	}
	if ran.Load() != 7 {
		t.Fatalf("the retry ran %d calls, want 7", ran.Load())
	}
}
