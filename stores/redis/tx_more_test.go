package redis_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// With Config.WaitReplicas the script and WAIT go in one pipeline: the
// charge is on the replica when RunInTx returns; with more replicas than
// there are, the commit is reported as a *ReplicationError.
func TestRunInTxWaitReplicas(t *testing.T) {
	master, err := testserver.StartRedis()
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
	rc := goredis.NewClient(&goredis.Options{Addr: replica.Addr})
	t.Cleanup(func() { _ = rc.Close() })
	ctx := context.Background()

	s := newStore(t, client, redis.Config{WaitReplicas: 1})
	if _, res, err := charge(ctx, newTxEngine(t, s), s, "acked", "charge:acked", 3, nil); err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("Do: %v, %v", res.Outcome, err)
	}
	if v, err := rc.Get(ctx, "charge:acked").Int(); v != 3 || err != nil {
		t.Fatalf("the replica's charge: %d, %v; want 3 when RunInTx returned", v, err)
	}

	s2 := newStore(t, client, redis.Config{WaitReplicas: 2, WaitTimeout: 50 * time.Millisecond})
	_, _, err = charge(ctx, newTxEngine(t, s2), s2, "short", "charge:short", 3, nil)
	var re *redis.ReplicationError
	if !errors.As(err, &re) {
		t.Fatalf("Do with 2 replicas wanted and 1 running: %v; want a *ReplicationError", err)
	}
}

// A run dedup.Config.Shadow lets through without a claim runs the queued
// commands alone (MULTI/EXEC) and completes nothing.
func TestRunInTxShadow(t *testing.T) {
	ctx := context.Background()
	client := newClient(t)
	s := newStore(t, client, redis.Config{KeyPrefix: "tx-shadow:"})
	e := newTxEngine(t, s)
	if _, _, err := charge(ctx, e, s, "k", "tx-shadow-charge", 1, nil); err != nil {
		t.Fatal(err)
	}
	shadow, err := dedup.NewEngine(dedup.Config{Store: s, Lease: time.Minute, Retention: time.Hour, Shadow: true})
	if err != nil {
		t.Fatal(err)
	}
	cmd, res, err := charge(ctx, shadow, s, "k", "tx-shadow-charge", 10, nil)
	if err != nil || res.Outcome != 0 {
		t.Fatalf("shadow Do of a completed key: %v, %v; want an unclaimed run", res.Outcome, err)
	}
	if v, err := cmd.Int64(); v != 11 || err != nil {
		t.Fatalf("the queued INCRBY replied %d, %v; want 11", v, err)
	}
}

// httpdedup with InTransaction: store.RunInTx: the handler's queued INCR,
// the stored response and the completed key in one script; the retry with
// the same key gets the stored response, and the INCR ran once.
func TestRunInTxHTTP(t *testing.T) {
	client := newClient(t)
	s := newStore(t, client, redis.Config{KeyPrefix: "tx-http:"})
	idem, err := httpdedup.New(httpdedup.Config{Dedup: dedup.Config{Store: s, Lease: time.Minute, Retention: time.Hour},
		InTransaction: s.RunInTx, Identity: httpdedup.StaticIdentity("acct_42")})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	h := idem.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		tx, ok := redis.TxFromContext(r.Context())
		if !ok {
			http.Error(w, "no transaction", http.StatusInternalServerError)
			return
		}
		k := tx.HashTag() + ":paid"
		if _, err := tx.Queue([]string{k}, "incr", k); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"payment":"p-1"}`)
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	for i := range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":5}`))
		req.Header.Set("Idempotency-Key", "key-1")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || string(body) != `{"payment":"p-1"}` {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times; want once", n)
	}
	keys, err := client.Keys(context.Background(), "{tx-http:*}:paid").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("paid keys %v, %v; want one", keys, err)
	}
	if v, _ := client.Get(context.Background(), keys[0]).Int(); v != 1 {
		t.Fatalf("paid = %d; want 1", v)
	}
}
