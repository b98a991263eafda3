package dynamo_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// Issue 13, failure 1: over HTTP on DynamoDB, a response whose stored record
// exceeds the 400 KB item (a 256 KiB body, the default bound, plus a 160 KB
// Link header, a default stored header) made Complete fail with
// ErrResultTooLarge. httpdedup retried it as a store error, left the record
// in progress, and after the lease a retry ran the handler a second time.
// Now the engine completes the record without the response: the handler
// runs once, and a retry learns the request was processed.
func TestHTTPResponseTooLargeForAnItemRunsOnce(t *testing.T) {
	store := newStore(t, dynamo.Config{})
	m, err := httpdedup.New(httpdedup.Config{
		Dedup: dedup.Config{
			Store: store,
			// A retry after the lease would run the handler again if the
			// record had stayed in progress.
			Lease: time.Second,
		},
		Identity: httpdedup.StaticIdentity(t.Name()),
	})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	body := bytes.Repeat([]byte("x"), httpdedup.DefaultMaxResponseBytes)
	link := "<https://example.test/" + strings.Repeat("l", 160_000) + ">; rel=next"
	srv := httptest.NewServer(m.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Link", link)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	})))
	t.Cleanup(srv.Close)
	key := "too-large-" + watermill.NewUUID()
	send := func() (int, http.Header, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b
	}
	if status, _, b := send(); status != http.StatusCreated || len(b) != len(body) {
		t.Fatalf("first request: %d with %d bytes, want 201 with the handler's %d", status, len(b), len(body))
	}
	time.Sleep(1500 * time.Millisecond) // past the lease, on the store's clock
	status, header, b := send()
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times, want once (a retry after the lease ran it again: %d)", runs.Load(), status)
	}
	if status != http.StatusConflict || !strings.Contains(string(b), httpdedup.ProblemResponseNotStored) || header.Get("Retry-After") != "" {
		t.Fatalf("retry: %d %s (Retry-After %q), want 409 %s without Retry-After", status, b, header.Get("Retry-After"), httpdedup.ProblemResponseNotStored)
	}
}
