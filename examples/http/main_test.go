package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

// The README's session, request by request, with the responses it shows
// (minus Date), on the in-process miniredis the example starts by default
// and on a real redis-server.

const (
	keyPayment    = `"8e03978e-40d5-43e8-bc93-6894a57f9324"`
	keyValidation = `"0f9a2c1e-4b7d-4e8a-9c3f-1d2e3f4a5b6c"`
	keySlow       = `"5d6e7f80-1a2b-4c3d-8e9f-a0b1c2d3e4f5"`
)

type step struct {
	name    string
	method  string
	path    string
	header  map[string]string
	body    string
	status  int
	headers map[string]string // expected response headers ("" = absent)
	resp    string            // expected body
}

func alice(key string) map[string]string {
	h := map[string]string{"Authorization": "Bearer sk_test_alice", "Content-Type": "application/json"}
	if key != "" {
		h["Idempotency-Key"] = key
	}
	return h
}

const paymentJSON = `{"id":"pay_0001","account":"acct_alice","amount":4200,"currency":"eur","status":"succeeded"}` + "\n"

var session = []step{
	{name: "first payment", method: "POST", path: "/payments", header: alice(keyPayment), body: `{"amount":4200,"currency":"eur"}`,
		status: 201, headers: map[string]string{"Location": "/payments/pay_0001", "Content-Type": "application/json", "Content-Length": "93", "Idempotent-Replayed": ""},
		resp: paymentJSON},
	{name: "retry: replayed", method: "POST", path: "/payments", header: alice(keyPayment), body: `{"amount":4200,"currency":"eur"}`,
		status: 201, headers: map[string]string{"Location": "/payments/pay_0001", "Content-Type": "application/json", "Content-Length": "93", "Idempotent-Replayed": "true"},
		resp: paymentJSON},
	{name: "same key, other amount", method: "POST", path: "/payments", header: alice(keyPayment), body: `{"amount":9900,"currency":"eur"}`,
		status: 422, headers: map[string]string{"Content-Type": "application/problem+json", "Cache-Control": "no-store"},
		resp: `{"type":"https://github.com/watermill-dedup/watermill-dedup/blob/main/httpdedup/README.md#key-reused","title":"Idempotency key reused","status":422,"detail":"This idempotency key was used with a different request; use a new key for a new request."}` + "\n"},
	{name: "no key", method: "POST", path: "/payments", header: alice(""), body: `{"amount":4200,"currency":"eur"}`,
		status: 400, headers: map[string]string{"Content-Type": "application/problem+json"},
		resp: `{"type":"https://github.com/watermill-dedup/watermill-dedup/blob/main/httpdedup/README.md#key-missing","title":"Idempotency key missing","status":400,"detail":"This operation requires an idempotency key: no Idempotency-Key header."}` + "\n"},
	{name: "bob, same key", method: "POST", path: "/payments",
		header: map[string]string{"Authorization": "Bearer sk_test_bob", "Idempotency-Key": keyPayment, "Content-Type": "application/json"}, body: `{"amount":4200,"currency":"eur"}`,
		status: 201, headers: map[string]string{"Location": "/payments/pay_0002", "Idempotent-Replayed": ""},
		resp: `{"id":"pay_0002","account":"acct_bob","amount":4200,"currency":"eur","status":"succeeded"}` + "\n"},
	{name: "validation error", method: "POST", path: "/payments", header: alice(keyValidation), body: `{"amount":0,"currency":"eur"}`,
		status: 400, headers: map[string]string{"Idempotent-Replayed": ""},
		resp: `{"error":"amount must be positive and currency a 3-letter code"}` + "\n"},
	{name: "validation error, retried", method: "POST", path: "/payments", header: alice(keyValidation), body: `{"amount":0,"currency":"eur"}`,
		status: 400, headers: map[string]string{"Idempotent-Replayed": "true"},
		resp: `{"error":"amount must be positive and currency a 3-letter code"}` + "\n"},
	// (the slow payment and its concurrent retry run here, see runSession)
	{name: "webhook", method: "POST", path: "/webhooks/payments-provider", body: `{"id":"evt_1","type":"payment.succeeded","data":{"payment_id":"pay_0001"}}`,
		status: 200, headers: map[string]string{"Idempotent-Replayed": ""}, resp: `{"received":"evt_1"}` + "\n"},
	{name: "webhook redelivered", method: "POST", path: "/webhooks/payments-provider", body: `{"id":"evt_1","type":"payment.succeeded","data":{"payment_id":"pay_0001"}}`,
		status: 200, headers: map[string]string{"Idempotent-Replayed": "true"}, resp: `{"received":"evt_1"}` + "\n"},
	{name: "another event, same payment", method: "POST", path: "/webhooks/payments-provider", body: `{"id":"evt_2","type":"payment.succeeded","data":{"payment_id":"pay_0001"}}`,
		status: 200, headers: map[string]string{"Idempotent-Replayed": ""}, resp: `{"received":"evt_2"}` + "\n"},
	{name: "stats", method: "GET", path: "/stats",
		status: 200, resp: `{"payments_created":3,"receipts_sent":1,"webhook_events_handled":2}` + "\n"},
	{name: "records", method: "GET", path: "/records",
		status: 200, resp: `["example:acct_alice POST /payments:0f9a2c1e-4b7d-4e8a-9c3f-1d2e3f4a5b6c",` +
			`"example:acct_alice POST /payments:5d6e7f80-1a2b-4c3d-8e9f-a0b1c2d3e4f5",` +
			`"example:acct_alice POST /payments:8e03978e-40d5-43e8-bc93-6894a57f9324",` +
			`"example:acct_bob POST /payments:8e03978e-40d5-43e8-bc93-6894a57f9324",` +
			`"example:payments-provider POST /webhooks/payments-provider:evt_1",` +
			`"example:payments-provider POST /webhooks/payments-provider:evt_2",` +
			`"example:send-receipt:pay_0001"]` + "\n"},
}

func do(t *testing.T, srv *httptest.Server, s step) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(s.method, srv.URL+s.path, strings.NewReader(s.body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range s.header {
		req.Header.Set(k, v)
	}
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s: %v", s.name, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

func check(t *testing.T, srv *httptest.Server, s step) {
	t.Helper()
	res, body := do(t, srv, s)
	if res.StatusCode != s.status || body != s.resp {
		t.Fatalf("%s: %d %q\nwant %d %q", s.name, res.StatusCode, body, s.status, s.resp)
	}
	for k, v := range s.headers {
		if got := res.Header.Get(k); got != v {
			t.Fatalf("%s: %s = %q, want %q", s.name, k, got, v)
		}
	}
}

func runSession(t *testing.T, client goredis.UniversalClient) {
	ctx := context.Background()
	a, err := newApp(ctx, client, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	started, release := make(chan struct{}), make(chan struct{})
	a.demoDelay = func(context.Context, time.Duration) {
		close(started)
		<-release
	}
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	// srv.Close waits for the slow request, which waits for release: a test
	// that stops before releasing it releases it first (cleanups run last
	// registered first), instead of hanging.
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock)

	for _, s := range session[:7] {
		check(t, srv, s)
	}

	// A slow payment, and the client's impatient retry while it runs.
	slow := step{name: "slow payment", method: "POST", path: "/payments", body: `{"amount":1500,"currency":"eur"}`,
		header: map[string]string{"Authorization": "Bearer sk_test_alice", "Idempotency-Key": keySlow, "X-Demo-Delay": "3s"}}
	type result struct {
		status int
		body   string
	}
	done := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(slow.method, srv.URL+slow.path, strings.NewReader(slow.body))
		for k, v := range slow.header {
			req.Header.Set(k, v)
		}
		res, err := srv.Client().Do(req)
		if err != nil {
			done <- result{status: -1, body: err.Error()}
			return
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		done <- result{res.StatusCode, string(b)}
	}()
	select {
	case <-started:
	case r := <-done:
		t.Fatalf("slow payment answered before its handler was held: %d %s", r.status, r.body)
	case <-time.After(time.Minute):
		t.Fatal("the slow payment's handler did not start within a minute")
	}
	retry := slow
	retry.name, retry.status = "concurrent retry", 409
	retry.headers = map[string]string{"Retry-After": "1", "Content-Type": "application/problem+json"}
	retry.resp = `{"type":"https://github.com/watermill-dedup/watermill-dedup/blob/main/httpdedup/README.md#request-in-progress","title":"Request in progress","status":409,"detail":"A request with this idempotency key is being processed; retry later to get its response."}` + "\n"
	check(t, srv, retry)
	unblock()
	var r result
	select {
	case r = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the slow payment was not answered within a minute of its release")
	}
	if r.status != 201 || !strings.Contains(r.body, `"id":"pay_0003"`) {
		t.Fatalf("slow payment: %d %s", r.status, r.body)
	}

	for _, s := range session[7:] {
		check(t, srv, s)
	}
	var stats map[string]int
	_, body := do(t, srv, step{method: "GET", path: "/stats"})
	if err := json.Unmarshal([]byte(body), &stats); err != nil || stats["receipts_sent"] != 1 {
		t.Fatalf("stats %s", body)
	}
}

func TestSessionOnMiniredis(t *testing.T) {
	client, _, closeRedis, err := openRedis("") // what the example starts without REDIS_ADDR
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeRedis)
	runSession(t, client)
}

func TestSessionOnRedis(t *testing.T) {
	server, err := testserver.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Close() })
	client := goredis.NewClient(&goredis.Options{Addr: server.Addr})
	t.Cleanup(func() { _ = client.Close() })
	runSession(t, client)
}
