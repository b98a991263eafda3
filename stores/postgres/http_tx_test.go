package postgres_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/crashtest"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// paymentsAPI is an Idempotency-Key API on PostgreSQL: POST /payments
// inserts one row into the orders table (which has no unique constraint:
// only the key keeps one row per request) through the request's
// transaction, then answers 201.
type paymentsAPI struct {
	o       *orders
	calls   atomic.Int64
	idem    *httpdedup.Middleware
	handler http.Handler
	// after runs after the row is written, before the response.
	after func(w http.ResponseWriter, r *http.Request)
}

const paymentsScopeIdentity = "acct_42"

func newPaymentsAPI(t testing.TB, o *orders, inTx bool, cfg httpdedup.Config) *paymentsAPI {
	t.Helper()
	api := &paymentsAPI{o: o}
	cfg.Dedup.Store = o.store
	cfg.Identity = httpdedup.StaticIdentity(paymentsScopeIdentity)
	if inTx {
		cfg.InTransaction = o.store.RunInTx
	}
	idem, err := httpdedup.New(cfg)
	if err != nil {
		t.Fatalf("httpdedup.New: %v", err)
	}
	api.idem = idem
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.Require(http.HandlerFunc(api.create)))
	api.handler = mux
	return api
}

func (api *paymentsAPI) create(w http.ResponseWriter, r *http.Request) {
	api.calls.Add(1)
	ctx := r.Context()
	key := r.Header.Get("Idempotency-Key")
	var err error
	if tx, ok := postgres.TxFromContext(ctx); ok {
		_, err = tx.Exec(ctx, "INSERT INTO "+api.o.table+" (order_id) VALUES ($1)", key)
	} else {
		_, err = pool.Exec(ctx, "INSERT INTO "+api.o.table+" (order_id) VALUES ($1)", key)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if api.after != nil {
		api.after(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"payment":%q}`, key)
}

// post sends POST /payments with key to base and returns status, replayed
// header and body.
func post(t testing.TB, base, key string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, base+"/payments", strings.NewReader(`{"amount":4200}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST /payments: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(body)
}

// problemType is the problem name of a problem+json body, "" for others.
func problemType(body string) string {
	var p httpdedup.Problem
	if json.Unmarshal([]byte(body), &p) != nil {
		return ""
	}
	_, name, _ := strings.Cut(p.Type, "#")
	return name
}

// TestHTTPTxCrashBeforeCommit: an API instance writes the payment row in
// the request's transaction and dies (SIGKILL, a real child process) before
// COMMIT. Nothing survives: no row, the key in progress until its lease
// ends (a retry meanwhile gets 409). Then the retry, served by another
// instance, runs the handler once (one row, 201, status and completion
// readable in the key's row) and a further retry is a replay.
func TestHTTPTxCrashBeforeCommit(t *testing.T) {
	const key = "5f0c8b1e-2a3d-4c6f-9b21-7d0e4a9c1f88"
	if crashtest.IsChild(t) {
		schema := os.Getenv(envChildSchema)
		s, err := postgres.New(testCtx(t), postgres.Config{DB: pool, Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		o := &orders{store: s, table: pgx.Identifier{schema, "orders"}.Sanitize()}
		api := newPaymentsAPI(t, o, true, httpdedup.Config{Dedup: dedup.Config{Lease: time.Hour}})
		api.after = func(http.ResponseWriter, *http.Request) { crashtest.Reach("written") }
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		crashtest.Say("listening", ln.Addr().String())
		t.Fatal(http.Serve(ln, api.handler))
	}

	o := newOrders(t)
	schema := strings.Trim(strings.SplitN(o.table, ".", 2)[0], `"`)
	child := crashtest.Start(t, []string{envChildDSN + "=" + dsn, envChildSchema + "=" + schema})
	addr := child.Wait(t, "listening")
	sent := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/payments", strings.NewReader(`{"amount":4200}`))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			err = fmt.Errorf("got a response, %s", resp.Status)
		}
		sent <- err
	}()
	child.Wait(t, "written") // the row is inserted in the open transaction
	child.Kill(t)
	if err := <-sent; err == nil || strings.Contains(err.Error(), "got a response") {
		t.Fatalf("the client of the killed instance: %v, want a broken connection", err)
	}

	s := o.store
	if n := o.count(t, key); n != 0 {
		t.Fatalf("%d payment rows after the crash, want 0 (rolled back)", n)
	}
	if got := readReadable(t, s, key); len(got) != 1 || got[0].State != "in_progress" {
		t.Fatalf("key after the crash: %+v, want in_progress", got)
	}

	api := newPaymentsAPI(t, o, true, httpdedup.Config{})
	srv := httptest.NewServer(api.handler)
	defer srv.Close()
	if status, _, body := post(t, srv.URL, key); status != http.StatusConflict || problemType(body) != httpdedup.ProblemRequestInProgress {
		t.Fatalf("retry during the dead instance's lease: %d %s, want 409 request-in-progress", status, body)
	}
	expire(t, s, admin.ScopedKey(httpdedup.Scope(paymentsScopeIdentity, http.MethodPost, "/payments"), key)) // the lease ends
	status, replayed, body := post(t, srv.URL, key)
	if status != http.StatusCreated || replayed != "" || body != `{"payment":"`+key+`"}` {
		t.Fatalf("retry after the lease: %d replayed=%q %s", status, replayed, body)
	}
	status, replayed, body2 := post(t, srv.URL, key)
	if status != http.StatusCreated || replayed != "true" || body2 != body {
		t.Fatalf("second retry: %d replayed=%q %s, want the replay", status, replayed, body2)
	}
	if n, calls := o.count(t, key), api.calls.Load(); n != 1 || calls != 1 {
		t.Fatalf("%d payment rows, handler ran %d times; want 1 and 1", n, calls)
	}
	got := readReadable(t, s, key)
	if len(got) != 1 || got[0].State != "completed" || got[0].ResponseStatus == nil || *got[0].ResponseStatus != http.StatusCreated ||
		got[0].Completed == nil || got[0].Scope != httpdedup.Scope(paymentsScopeIdentity, http.MethodPost, "/payments") {
		t.Fatalf("the key's row: %+v", got)
	}
	t.Logf("crash before COMMIT: 0 rows and the key in progress; retry after the lease: 1 row, 201; second retry: replayed; handler calls after the crash: %d", api.calls.Load())
}

// TestHTTPTxResponseTooLarge: the handler writes its row, then a response
// larger than MaxResponseBytes. The handler ran to its end: its row
// commits with the record, completed without the response, and the client
// and the retry get 409 response-not-stored; the handler runs once.
func TestHTTPTxResponseTooLarge(t *testing.T) {
	o := newOrders(t)
	api := newPaymentsAPI(t, o, true, httpdedup.Config{MaxResponseBytes: 1024})
	api.after = func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(make([]byte, 2048))
	}
	srv := httptest.NewServer(api.handler)
	defer srv.Close()
	for i := range 2 {
		status, _, body := post(t, srv.URL, "big")
		if status != http.StatusConflict || problemType(body) != httpdedup.ProblemResponseNotStored {
			t.Fatalf("attempt %d: %d %s, want 409 response-not-stored", i, status, body)
		}
		if n := o.count(t, "big"); n != 1 {
			t.Fatalf("attempt %d: %d rows, want 1 (committed with the record)", i, n)
		}
		if got := readReadable(t, o.store, "big"); len(got) != 1 || got[0].State != "completed" {
			t.Fatalf("attempt %d: key %+v, want completed", i, got)
		}
	}
	if calls := api.calls.Load(); calls != 1 {
		t.Fatalf("handler ran %d times, want 1 (the key was completed)", calls)
	}
}

// TestHTTPTxNotCommitted: the claim is lost while the handler runs (its
// record expired and was taken over); the completion in the transaction
// finds no row, so the payment row is rolled back and the client gets 503
// not-committed with Retry-After.
func TestHTTPTxNotCommitted(t *testing.T) {
	o := newOrders(t)
	api := newPaymentsAPI(t, o, true, httpdedup.Config{})
	recordKey := admin.ScopedKey(httpdedup.Scope(paymentsScopeIdentity, http.MethodPost, "/payments"), "lost")
	api.after = func(w http.ResponseWriter, r *http.Request) {
		expire(t, o.store, recordKey)
		if res, err := o.store.Claim(r.Context(), recordKey, "", time.Minute); err != nil || res.Outcome != dedup.Acquired {
			t.Errorf("takeover: %v %v", res.Outcome, err)
		}
		w.WriteHeader(http.StatusCreated)
	}
	srv := httptest.NewServer(api.handler)
	defer srv.Close()
	req, _ := http.NewRequestWithContext(testCtx(t), http.MethodPost, srv.URL+"/payments", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "lost")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || problemType(string(body)) != httpdedup.ProblemNotCommitted || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("%s %s, want 503 not-committed with Retry-After", resp.Status, body)
	}
	if n := o.count(t, "lost"); n != 0 {
		t.Fatalf("%d rows, want 0 (rolled back)", n)
	}
}

// TestHTTPResponseStatusWithoutTx: without InTransaction, the response is
// stored by the engine's Complete, which still fills response_status; a 500
// releases the key (no row for it).
func TestHTTPResponseStatusWithoutTx(t *testing.T) {
	o := newOrders(t)
	api := newPaymentsAPI(t, o, false, httpdedup.Config{})
	srv := httptest.NewServer(api.handler)
	defer srv.Close()
	if status, _, _ := post(t, srv.URL, "plain"); status != http.StatusCreated {
		t.Fatalf("status %d", status)
	}
	got := readReadable(t, o.store, "plain")
	if len(got) != 1 || got[0].ResponseStatus == nil || *got[0].ResponseStatus != http.StatusCreated || got[0].Completed == nil {
		t.Fatalf("the key's row: %+v", got)
	}
	api.after = func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadGateway) }
	if status, _, _ := post(t, srv.URL, "failed"); status != http.StatusBadGateway {
		t.Fatalf("status %d", status)
	}
	if got := readReadable(t, o.store, "failed"); !released(got) {
		t.Fatalf("key of a 502: %+v, want released", got)
	}
}
