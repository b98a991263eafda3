package httpdedup_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// redisServer is a real redis-server on a free loopback port, shared by the
// package's tests; each test gets its own key prefix.
var redisServer *testserver.Redis

func TestMain(m *testing.M) {
	testserver.Main(m, func() (func(), error) {
		r, err := testserver.StartRedis()
		if err != nil {
			return nil, err
		}
		redisServer = r
		return func() { _ = r.Close() }, nil
	})
}

// backend is one store the matrix runs on.
type backend struct {
	name string
	new  func(t *testing.T, clock dedup.Clock) (dedup.Store, *goredis.Client)
}

var backends = []backend{
	{"redis", func(t *testing.T, _ dedup.Clock) (dedup.Store, *goredis.Client) {
		client := goredis.NewClient(&goredis.Options{Addr: redisServer.Addr})
		t.Cleanup(func() { _ = client.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := dedupredis.New(ctx, dedupredis.Config{Client: client, KeyPrefix: testPrefix(t)})
		if err != nil {
			t.Fatalf("dedupredis.New: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s, client
	}},
	{"memory", func(_ *testing.T, clock dedup.Clock) (dedup.Store, *goredis.Client) {
		return memstore.New(clock), nil
	}},
}

// testPrefix is a Redis key prefix of the test's own: its name and a random
// part, so that -count=N and reruns on the shared server start empty.
func testPrefix(t *testing.T) string {
	// One colon, at the end: the Redis store refuses nested prefixes.
	return "httpdedup-test-" + strings.ReplaceAll(t.Name(), ":", "-") + "-" + storekit.NewToken()[:8] + ":"
}

// forEachStore runs test on a real Redis and on the memory store, in
// parallel subtests.
func forEachStore(t *testing.T, test func(t *testing.T, store dedup.Store)) {
	t.Helper()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			store, _ := b.new(t, nil)
			test(t, store)
		})
	}
}

// accountIdentity is the test's authentication: the X-Account header.
func accountIdentity(r *http.Request) (string, error) {
	a := r.Header.Get("X-Account")
	if a == "" {
		return "", errors.New("no X-Account header")
	}
	return a, nil
}

func newMiddleware(t *testing.T, cfg httpdedup.Config) *httpdedup.Middleware {
	t.Helper()
	if cfg.Identity == nil {
		cfg.Identity = accountIdentity
	}
	m, err := httpdedup.New(cfg)
	if err != nil {
		t.Fatalf("httpdedup.New: %v", err)
	}
	return m
}

// payments is a handler standing for POST /payments: it counts its runs and
// answers 201 with the run number, the caller and the request body, so that
// a replay (same run number) tells apart from a second run. It also sets
// headers that must not be replayed.
type payments struct {
	runs atomic.Int64
}

func (p *payments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := p.runs.Add(1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	id := "pay_" + string(rune('0'+n%10))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+id)
	w.Header().Set("Set-Cookie", "session=abc")
	w.Header().Set("X-Run", id)
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "account": r.Header.Get("X-Account"), "request": string(body)})
}

// response is what a test request got.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) problem(t *testing.T) httpdedup.Problem {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != httpdedup.ProblemContentType {
		t.Fatalf("Content-Type = %q, want %q (status %d, body %s)", ct, httpdedup.ProblemContentType, r.status, r.body)
	}
	var p httpdedup.Problem
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	if p.Status != r.status {
		t.Fatalf("problem status %d, response status %d", p.Status, r.status)
	}
	if p.Title == "" || p.Detail == "" {
		t.Fatalf("problem without title or detail: %+v", p)
	}
	return p
}

// wantProblem checks that r is a problem+json response of the given status
// and problem name.
func wantProblem(t *testing.T, r response, status int, name string) httpdedup.Problem {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d; body %s", r.status, status, r.body)
	}
	p := r.problem(t)
	if want := httpdedup.DefaultProblemTypeBase + name; p.Type != want {
		t.Fatalf("problem type = %q, want %q", p.Type, want)
	}
	return p
}

// req describes a test request.
type req struct {
	method  string // default POST
	path    string // default /payments
	account string // X-Account; default "acct_1"; "-" for none
	key     string // Idempotency-Key value verbatim; "" for none
	body    string
	header  http.Header
}

func (q req) build(t testing.TB, base string) *http.Request {
	t.Helper()
	if q.method == "" {
		q.method = http.MethodPost
	}
	if q.path == "" {
		q.path = "/payments"
	}
	r, err := http.NewRequest(q.method, base+q.path, strings.NewReader(q.body))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range q.header {
		r.Header[k] = vs
	}
	switch q.account {
	case "":
		r.Header.Set("X-Account", "acct_1")
	case "-":
	default:
		r.Header.Set("X-Account", q.account)
	}
	if q.key != "" {
		r.Header.Set("Idempotency-Key", q.key)
	}
	return r
}

// serve runs the request through h in process (no network), so that
// requests net/http's client would refuse to send (control characters in a
// header) can be tested too.
func serve(t testing.TB, h http.Handler, q req) response {
	t.Helper()
	return serveRequest(h, q.build(t, "http://api.test"))
}

// serveRequest is serve for goroutines: it takes a built request and never
// calls t.
func serveRequest(h http.Handler, r *http.Request) response {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	res := rec.Result()
	body, _ := io.ReadAll(res.Body)
	return response{status: res.StatusCode, header: res.Header, body: body}
}

// send sends the request over the loopback network to srv. It must not be
// called with t.Fatal semantics from a goroutine: it returns the error.
func send(srv *httptest.Server, r *http.Request) (response, error) {
	res, err := srv.Client().Do(r)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return response{}, err
	}
	return response{status: res.StatusCode, header: res.Header, body: body}, nil
}

func mustSend(t *testing.T, srv *httptest.Server, q req) response {
	t.Helper()
	r, err := send(srv, q.build(t, srv.URL))
	if err != nil {
		t.Fatalf("%s %s: %v", q.method, q.path, err)
	}
	return r
}

// blockingHandler runs until released, reporting each start.
type blockingHandler struct {
	started chan struct{}
	release chan struct{}
	once    sync.Once
	runs    atomic.Int64
	inner   http.Handler
}

func newBlockingHandler(inner http.Handler) *blockingHandler {
	return &blockingHandler{started: make(chan struct{}, 16), release: make(chan struct{}), inner: inner}
}

// unblock lets every run finish; tests also register it with t.Cleanup
// (after the server's Close, so it runs first) so that a failing test does
// not leave the server waiting for a blocked handler.
func (b *blockingHandler) unblock() { b.once.Do(func() { close(b.release) }) }

func (b *blockingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.runs.Add(1)
	b.started <- struct{}{}
	<-b.release
	b.inner.ServeHTTP(w, r)
}

// recorder is a dedup.Observer that keeps the decisions.
type recorder struct {
	mu        sync.Mutex
	decisions []dedup.Decision
}

func (r *recorder) ObserveDecision(d dedup.Decision) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.decisions = append(r.decisions, d)
}

func (r *recorder) ObserveStoreOp(string, time.Duration, error) {}

func (r *recorder) all() []dedup.Decision {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]dedup.Decision(nil), r.decisions...)
}

func (r *recorder) events() []event.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []event.Event
	for _, d := range r.decisions {
		out = append(out, d.Event)
	}
	return out
}

// faultyStore wraps a store and fails the chosen operations.
type faultyStore struct {
	dedup.Store
	claimErr, completeErr, releaseErr, extendErr error
	completeFailures                             atomic.Int64 // fail Complete this many times, then pass
	completes                                    atomic.Int64
}

var errStoreDown = errors.New("store down")

func (s *faultyStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	if s.claimErr != nil {
		return dedup.ClaimResult{}, s.claimErr
	}
	return s.Store.Claim(ctx, key, fp, lease)
}

func (s *faultyStore) Complete(ctx context.Context, c dedup.Claim, result []byte, retention time.Duration) error {
	s.completes.Add(1)
	if s.completeFailures.Add(-1) >= 0 {
		return s.completeErr
	}
	return s.Store.Complete(ctx, c, result, retention)
}

func (s *faultyStore) Release(ctx context.Context, c dedup.Claim) error {
	if s.releaseErr != nil {
		return s.releaseErr
	}
	return s.Store.Release(ctx, c)
}

func (s *faultyStore) Extend(ctx context.Context, c dedup.Claim, lease time.Duration) error {
	if s.extendErr != nil {
		return s.extendErr
	}
	return s.Store.Extend(ctx, c, lease)
}

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newFakeClock() *fakeclock.Clock { return fakeclock.New(epoch) }

// waitCompletes waits until the store has seen n Complete calls: the
// middleware's lease timer is pending while the handler runs, so a test
// that waits for the Complete backoff timer first waits for the Complete
// before it.
func waitCompletes(t *testing.T, s *faultyStore, n int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for s.completes.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %d Complete call(s): %d after 20s", n, s.completes.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// waitTimerAt waits until a timer due d from the clock's now is pending:
// the middleware's next heartbeat, told apart from the deadline timer it
// keeps while an extension is in flight.
func waitTimerAt(t *testing.T, clock *fakeclock.Clock, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := clock.WaitForTimerAt(ctx, clock.Now().Add(d)); err != nil {
		t.Fatalf("waiting for the timer due in %v: %v", d, err)
	}
}

// waitTimers waits until n timers are pending on clock: a goroutine of the
// middleware (heartbeat, Complete backoff) is waiting for time to pass.
// recv returns the next value from ch (the zero value once ch is closed),
// and fails the test naming what it awaited when none comes within a
// minute: a bug that blocks a handler or a request fails the test instead
// of hanging the package until go test's timeout.
func recv[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("%s did not happen within a minute", what)
		panic("unreachable")
	}
}

func waitTimers(t *testing.T, clock *fakeclock.Clock, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := clock.WaitForTimers(ctx, n); err != nil {
		t.Fatalf("waiting for %d pending timer(s): %v", n, err)
	}
}
