package httpdedup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

func TestIdentityFailureGets401(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		a := newAPI(t, store, httpdedup.Config{})
		wantProblem(t, mustSend(t, a.srv, req{key: "k", account: "-"}), http.StatusUnauthorized, httpdedup.ProblemUnidentifiedCaller)

		m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store}, Identity: func(*http.Request) (string, error) { return "", nil }})
		wantProblem(t, serve(t, m.Require(a.pay), req{key: "k"}), http.StatusUnauthorized, httpdedup.ProblemUnidentifiedCaller)

		m = newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store}, Identity: httpdedup.StaticIdentity("")})
		wantProblem(t, serve(t, m.Require(a.pay), req{key: "k"}), http.StatusUnauthorized, httpdedup.ProblemUnidentifiedCaller)
		if a.pay.runs.Load() != 0 {
			t.Fatal("the handler ran")
		}
	})
}

func TestRedisDownGets503AndRunsNothing(t *testing.T) {
	server, err := testserver.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Close() })
	client := goredis.NewClient(&goredis.Options{Addr: server.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	store, err := dedupredis.New(context.Background(), dedupredis.Config{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	a := newAPI(t, store, httpdedup.Config{RetryAfter: 1500 * time.Millisecond})
	if err := server.Kill(); err != nil {
		t.Fatal(err)
	}
	r := mustSend(t, a.srv, req{key: "k-down", body: "x"})
	wantProblem(t, r, http.StatusServiceUnavailable, httpdedup.ProblemStoreUnavailable)
	if got := r.header.Get("Retry-After"); got != "2" {
		t.Fatalf("Retry-After = %q, want 2 (1.5s rounded up)", got)
	}
	if a.pay.runs.Load() != 0 {
		t.Fatal("the handler ran without a claim")
	}
	// Back up: the same key runs.
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	if r := mustSend(t, a.srv, req{key: "k-down", body: "x"}); r.status != http.StatusCreated {
		t.Fatalf("after restart: %d %s", r.status, r.body)
	}
}

// TestFailOpenRunsTheHandlerUnclaimed: with Dedup.FailOpen, a request
// whose claim the store cannot answer runs the handler without a claim
// (decided fail_open) and gets its response, stored nowhere: a retry runs
// it again. Without it, 503 and no run (TestRedisDownGets503AndRunsNothing).
func TestFailOpenRunsTheHandlerUnclaimed(t *testing.T) {
	store := &faultyStore{Store: memstore.New(nil), claimErr: errStoreDown}
	rec := &recorder{}
	a := newAPI(t, store, httpdedup.Config{Dedup: dedup.Config{FailOpen: true, Observer: rec}})
	for i := 1; i <= 2; i++ {
		r := mustSend(t, a.srv, req{key: "k", body: "x"})
		if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("request %d: %d replayed=%q %s, want 201 from the handler", i, r.status, r.header.Get("Idempotent-Replayed"), r.body)
		}
	}
	if n := a.pay.runs.Load(); n != 2 {
		t.Fatalf("the handler ran %d times, want 2 (unclaimed, nothing stored)", n)
	}
	if n := store.completes.Load(); n != 0 {
		t.Fatalf("%d completions of an unclaimed run", n)
	}
	failOpen := 0
	for _, d := range rec.all() {
		if d.Event == event.FailOpen {
			failOpen++
		}
	}
	if failOpen != 2 {
		t.Fatalf("%d fail_open decisions, want 2", failOpen)
	}
}

func TestCompleteFailureStillSendsTheResponse(t *testing.T) {
	clock := newFakeClock()
	store := &faultyStore{Store: memstore.New(clock), completeErr: errStoreDown}
	store.completeFailures.Store(100)
	rec := &recorder{}
	a := newAPI(t, store, httpdedup.Config{Dedup: dedup.Config{Clock: clock, Lease: time.Minute, DisableHeartbeat: true, Observer: rec, CompleteRetries: 2, CompleteBackoff: time.Second}})

	done := make(chan response, 1)
	first := req{key: "k", body: "x"}.build(t, a.srv.URL)
	go func() {
		r, err := send(a.srv, first)
		if err != nil {
			r.status = -1
		}
		done <- r
	}()
	for i, backoff := range []time.Duration{time.Second, 2 * time.Second} {
		waitCompletes(t, store, int64(i+1))
		waitTimers(t, clock, 1)
		clock.Advance(backoff)
	}
	r := recv(t, "the response after the Complete retries", done)
	if r.status != http.StatusCreated {
		t.Fatalf("status %d: the response of a handler that ran must be sent", r.status)
	}
	if got := store.completes.Load(); got != 3 {
		t.Fatalf("Complete called %d times, want 1 + 2 retries", got)
	}
	var storeErr *dedup.StoreError
	decisions := rec.all()
	last := decisions[len(decisions)-1]
	if last.Event != event.StoreError || !errors.As(last.Err, &storeErr) || storeErr.Op != "complete" || !errors.Is(last.Err, errStoreDown) {
		t.Fatalf("last decision %+v, want a complete store_error", last)
	}
	// The record stays in progress until its lease ends.
	wantProblem(t, mustSend(t, a.srv, req{key: "k", body: "x"}), http.StatusConflict, httpdedup.ProblemRequestInProgress)
	clock.Advance(time.Minute) // the lease
	store.completeFailures.Store(0)
	if r := mustSend(t, a.srv, req{key: "k", body: "x"}); r.status != http.StatusCreated || a.pay.runs.Load() != 2 {
		t.Fatalf("after the lease: %d, runs %d", r.status, a.pay.runs.Load())
	}
}

func TestCompleteRetrySucceeds(t *testing.T) {
	clock := newFakeClock()
	store := &faultyStore{Store: memstore.New(clock), completeErr: errStoreDown}
	store.completeFailures.Store(1)
	a := newAPI(t, store, httpdedup.Config{Dedup: dedup.Config{Clock: clock, DisableHeartbeat: true, CompleteBackoff: time.Second}})
	done := make(chan int, 1)
	first := req{key: "k", body: "x"}.build(t, a.srv.URL)
	go func() {
		r, _ := send(a.srv, first)
		done <- r.status
	}()
	waitCompletes(t, store, 1)
	waitTimers(t, clock, 1)
	clock.Advance(time.Second) // the backoff
	if s := recv(t, "the response after the Complete retry", done); s != http.StatusCreated {
		t.Fatalf("status %d", s)
	}
	if r := mustSend(t, a.srv, req{key: "k", body: "x"}); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("not replayed after a retried Complete: %d", r.status)
	}
}

func TestReleaseFailureLeavesKeyInProgressUntilLease(t *testing.T) {
	clock := newFakeClock()
	store := &faultyStore{Store: memstore.New(clock), releaseErr: errStoreDown}
	m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store, Clock: clock, DisableHeartbeat: true, Lease: time.Minute}})
	h := m.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) }))
	if r := serve(t, h, req{key: "k"}); r.status != http.StatusBadGateway {
		t.Fatalf("status %d", r.status)
	}
	wantProblem(t, serve(t, h, req{key: "k"}), http.StatusConflict, httpdedup.ProblemRequestInProgress)
	clock.Advance(time.Minute)
	if r := serve(t, h, req{key: "k"}); r.status != http.StatusBadGateway {
		t.Fatalf("after the lease: %d", r.status)
	}
}

func TestHeartbeatKeepsASlowHandlersClaim(t *testing.T) {
	clock := newFakeClock()
	store := memstore.New(clock)
	blocking := newBlockingHandler(&payments{})
	m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store, Clock: clock, Lease: 30 * time.Second}})
	srv := httptest.NewServer(m.Require(blocking))
	t.Cleanup(srv.Close)
	t.Cleanup(blocking.unblock)

	done := make(chan response, 1)
	slow := req{key: "k-slow", body: "x"}.build(t, srv.URL)
	go func() {
		r, _ := send(srv, slow)
		done <- r
	}()
	recv(t, "the blocked handler to start", blocking.started)
	for i := 0; i < 9; i++ { // 90s: three leases
		waitTimerAt(t, clock, 10*time.Second)
		clock.Advance(10 * time.Second)
	}
	waitTimerAt(t, clock, 10*time.Second)
	wantProblem(t, mustSend(t, srv, req{key: "k-slow", body: "x"}), http.StatusConflict, httpdedup.ProblemRequestInProgress)
	blocking.unblock()
	first := recv(t, "the slow handler's response", done)
	if first.status != http.StatusCreated {
		t.Fatalf("slow handler: %d", first.status)
	}
	if r := mustSend(t, srv, req{key: "k-slow", body: "x"}); !bytes.Equal(r.body, first.body) || blocking.runs.Load() != 1 {
		t.Fatalf("after the slow handler: %s, runs %d", r.body, blocking.runs.Load())
	}
}

func TestWithoutHeartbeatASlowHandlerIsTakenOver(t *testing.T) {
	// The counterpart of TestHeartbeatKeepsASlowHandlersClaim: it shows that
	// the lease does end, so the heartbeat is what keeps the claim.
	clock := newFakeClock()
	store := memstore.New(clock)
	blocking := newBlockingHandler(&payments{})
	m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store, Clock: clock, Lease: 30 * time.Second, DisableHeartbeat: true}})
	h := m.Require(blocking)
	done := make(chan struct{})
	firstReq, secondReq := req{key: "k-slow", body: "x"}.build(t, "http://api.test"), req{key: "k-slow", body: "x"}.build(t, "http://api.test")
	go func() {
		defer close(done)
		serveRequest(h, firstReq)
	}()
	recv(t, "the blocked handler to start", blocking.started)
	clock.Advance(30 * time.Second)
	second := make(chan response, 1)
	go func() { second <- serveRequest(h, secondReq) }()
	recv(t, "the second request's handler to start", blocking.started) // the second request runs the handler too
	blocking.unblock()
	recv(t, "the first request to end", done)
	recv(t, "the second request to end", second)
	if blocking.runs.Load() != 2 {
		t.Fatalf("runs %d", blocking.runs.Load())
	}
}

func TestHeartbeatExtendsTheRedisRecord(t *testing.T) {
	clock := newFakeClock()
	client := goredis.NewClient(&goredis.Options{Addr: redisServer.Addr})
	t.Cleanup(func() { _ = client.Close() })
	store, err := dedupredis.New(context.Background(), dedupredis.Config{Client: client, KeyPrefix: testPrefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	blocking := newBlockingHandler(&payments{})
	m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store, Clock: clock, Lease: time.Hour, Heartbeat: 20 * time.Minute}})
	done := make(chan struct{})
	hbReq := req{key: "k-hb", body: "x"}.build(t, "http://api.test")
	t.Cleanup(blocking.unblock)
	go func() {
		defer close(done)
		serveRequest(m.Require(blocking), hbReq)
	}()
	recv(t, "the blocked handler to start", blocking.started)
	redisKey := store.RedisKey(admin.ScopedKey(httpdedup.Scope("acct_1", "POST", "/payments"), "k-hb"))
	ctx := context.Background()
	if err := client.PExpire(ctx, redisKey, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	waitTimerAt(t, clock, 20*time.Minute)
	clock.Advance(20 * time.Minute)
	waitTimerAt(t, clock, 20*time.Minute) // the extension is done: the next heartbeat is armed
	ttl, err := client.PTTL(ctx, redisKey).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl <= time.Minute {
		t.Fatalf("PTTL %v after a heartbeat; want the lease (1h) again", ttl)
	}
	blocking.unblock()
	recv(t, "the request to end", done)
}

func TestLostClaimCancelsTheHandler(t *testing.T) {
	clock := newFakeClock()
	store := &faultyStore{Store: memstore.New(clock), extendErr: dedup.ErrClaimLost}
	rec := &recorder{}
	cause := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		cause <- context.Cause(r.Context())
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store, Clock: clock, Lease: 30 * time.Second, Observer: rec}})
	done := make(chan response, 1)
	lostReq := req{key: "k"}.build(t, "http://api.test")
	go func() { done <- serveRequest(m.Require(h), lostReq) }()
	waitTimers(t, clock, 1)
	clock.Advance(10 * time.Second) // the heartbeat: Lease/3
	if err := recv(t, "the handler's context to be cancelled", cause); !errors.Is(err, dedup.ErrClaimLost) {
		t.Fatalf("handler context cause %v, want ErrClaimLost", err)
	}
	if r := recv(t, "the response of the cancelled handler", done); r.status != http.StatusServiceUnavailable {
		t.Fatalf("status %d", r.status)
	}
	found := false
	for _, d := range rec.all() {
		found = found || d.Event == event.ClaimLost && d.Op == "extend"
	}
	if !found {
		t.Fatalf("no claim_lost decision: %v", rec.events())
	}
}

func TestCorruptStoredResponseGets500(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		ctx := context.Background()
		key := admin.ScopedKey(httpdedup.Scope("acct_1", "POST", "/payments"), "k-corrupt")
		res, err := store.Claim(ctx, key, "", time.Minute)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("claim: %v %v", res.Outcome, err)
		}
		if err := store.Complete(ctx, res.Claim, []byte{9, 9, 9}, time.Hour); err != nil {
			t.Fatal(err)
		}
		a := newAPI(t, store, httpdedup.Config{})
		wantProblem(t, mustSend(t, a.srv, req{key: "k-corrupt", body: "x"}), http.StatusInternalServerError, httpdedup.ProblemStoredResponse)
		if a.pay.runs.Load() != 0 {
			t.Fatal("the handler ran for a completed key")
		}
	})
}

func TestReplayIsByteForByte(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		binary := make([]byte, 0, 512)
		for i := 0; i < 512; i++ {
			binary = append(binary, byte(i))
		}
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("sniff") != "" {
				_, _ = w.Write([]byte("<html><body>receipt</body></html>")) // no Content-Type: net/http sniffs one
				return
			}
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Add("Link", "</a>; rel=a")
			w.Header().Add("Link", "</b>; rel=b")
			w.Header().Set("Cache-Control", "private")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(binary[:100])
			_, _ = w.Write(binary[100:])
		})
		m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store}})
		srv := httptest.NewServer(m.Require(h))
		t.Cleanup(srv.Close)
		for _, q := range []req{{key: "k-bin"}, {key: "k-sniff", path: "/receipt?sniff=1"}} {
			first := mustSend(t, srv, q)
			second := mustSend(t, srv, q)
			if second.header.Get("Idempotent-Replayed") != "true" || second.status != first.status || !bytes.Equal(first.body, second.body) {
				t.Fatalf("%s: replay %d %q, first %d %q", q.key, second.status, second.body, first.status, first.body)
			}
			for _, name := range []string{"Content-Type", "Content-Length", "Cache-Control"} {
				if first.header.Get(name) != second.header.Get(name) {
					t.Fatalf("%s: %s %q, first %q", q.key, name, second.header.Get(name), first.header.Get(name))
				}
			}
			if got, want := second.header.Values("Link"), first.header.Values("Link"); len(got) != len(want) || len(got) > 0 && got[0] != want[0] {
				t.Fatalf("%s: Link %q, first %q", q.key, got, want)
			}
		}
		if r := mustSend(t, srv, req{key: "k-bin"}); !bytes.Equal(r.body, binary) {
			t.Fatal("the binary body changed")
		}
		if r := mustSend(t, srv, req{key: "k-sniff", path: "/receipt?sniff=1"}); r.header.Get("Content-Type") != "text/html; charset=utf-8" {
			t.Fatalf("sniffed Content-Type %q", r.header.Get("Content-Type"))
		}
	})
}

func TestStoredHeadersAreConfigurable(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		a := newAPI(t, store, httpdedup.Config{StoredHeaders: []string{"x-run"}, ReplayedHeader: "x-replayed"})
		first := mustSend(t, a.srv, req{key: "k", body: "x"})
		second := mustSend(t, a.srv, req{key: "k", body: "x"})
		if second.header.Get("X-Replayed") != "true" || second.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("replay header: %v", second.header)
		}
		if second.header.Get("X-Run") != first.header.Get("X-Run") || second.header.Get("Location") != "" {
			t.Fatalf("stored headers: %v", second.header)
		}
	})
}

func TestWebhookKeys(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		for name, key := range map[string]httpdedup.KeyFunc{
			"header": httpdedup.HeaderKey("webhook-id"),
			"body":   httpdedup.BodyKey(keyfuncs.JSON("id")),
		} {
			t.Run(name, func(t *testing.T) {
				runs := 0
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs++
					w.WriteHeader(http.StatusNoContent)
				})
				m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store}, Key: key, Identity: httpdedup.StaticIdentity("provider-" + name)})
				hook := m.Require(h)
				event := req{path: "/webhooks", account: "-", body: `{"id":"evt_1","type":"payment.succeeded"}`, header: http.Header{"Webhook-Id": {"evt_1"}}}
				if r := serve(t, hook, event); r.status != http.StatusNoContent {
					t.Fatalf("first delivery: %d %s", r.status, r.body)
				}
				r := serve(t, hook, event)
				if r.status != http.StatusNoContent || r.header.Get("Idempotent-Replayed") != "true" || runs != 1 {
					t.Fatalf("redelivery: %d, replayed %q, runs %d", r.status, r.header.Get("Idempotent-Replayed"), runs)
				}
				noID := req{path: "/webhooks", account: "-", body: `{"type":"payment.succeeded"}`}
				p := wantProblem(t, serve(t, hook, noID), http.StatusBadRequest, httpdedup.ProblemKeyMissing)
				want := map[string]string{"header": "Webhook-Id", "body": "json:id"}[name]
				if !strings.Contains(p.Detail, want) {
					t.Fatalf("detail %q does not name %s", p.Detail, want)
				}
			})
		}
	})
}

func TestCustomKeyErrorsAreNotShownToClients(t *testing.T) {
	for name, c := range map[string]struct {
		err     error
		problem string
	}{
		"missing": {fmt.Errorf("lookup in table tenant_keys: %w", httpdedup.ErrKeyMissing), httpdedup.ProblemKeyMissing},
		"other":   {errors.New("lookup in table tenant_keys failed"), httpdedup.ProblemKeyInvalid},
	} {
		m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: memstore.New(nil)}, Key: func(*http.Request, httpdedup.BodyFunc) (string, error) {
			return "", c.err
		}})
		h := m.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Error("the handler ran") }))
		p := wantProblem(t, serve(t, h, req{}), http.StatusBadRequest, c.problem)
		if strings.Contains(p.Detail, "tenant_keys") {
			t.Fatalf("%s: detail %q shows the KeyFunc's error", name, p.Detail)
		}
	}
}

func TestBodyKeyOverTheLimitGets413(t *testing.T) {
	m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: memstore.New(nil)}, Key: httpdedup.BodyKey(keyfuncs.JSON("id")), MaxBodyBytes: 8})
	h := m.Optional(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Error("the handler ran") }))
	wantProblem(t, serve(t, h, req{body: `{"id":"evt_000001"}`}), http.StatusRequestEntityTooLarge, httpdedup.ProblemBodyTooLarge)
}

func TestFingerprintErrorGets400(t *testing.T) {
	m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: memstore.New(nil)}, Fingerprint: func(*http.Request, []byte) (string, error) {
		return "", errors.New("amount is not a number")
	}})
	h := m.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Error("the handler ran") }))
	wantProblem(t, serve(t, h, req{key: "k"}), http.StatusBadRequest, httpdedup.ProblemFingerprintFailed)
}

func TestDecisionsAreObserved(t *testing.T) {
	rec := &recorder{}
	clock := newFakeClock()
	a := newAPI(t, memstore.New(clock), httpdedup.Config{Dedup: dedup.Config{Observer: rec, Clock: clock}})
	mustSend(t, a.srv, req{key: "k", body: "x"})
	mustSend(t, a.srv, req{key: "k", body: "x"})
	mustSend(t, a.srv, req{key: "k", body: "y"})
	mustSend(t, a.srv, req{body: "x"})
	want := []event.Event{event.ClaimWon, event.Completed, event.SkipDuplicate, event.KeyReuse, event.KeyMissing}
	got := rec.events()
	if len(got) != len(want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("events %v, want %v", got, want)
		}
	}
	d := rec.all()[0]
	wantKey := admin.ScopedKey(httpdedup.Scope("acct_1", "POST", "/payments"), "k")
	if d.Handler != "POST /payments" || d.Topic != "http" || d.Key != wantKey || d.Op != "claim" {
		t.Fatalf("decision %+v", d)
	}
}
