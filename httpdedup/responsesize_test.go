package httpdedup_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// post serves one POST with key through h and returns the recorder.
func post(h http.Handler, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// problemType is the "type" of a problem+json body, "" for other bodies.
func problemType(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	if w.Header().Get("Content-Type") != httpdedup.ProblemContentType {
		return ""
	}
	var p httpdedup.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	return p.Type
}

// TestResponseOverMaxResponseBytesCompletesWithoutIt: the handler's
// effect happened; a response too large to buffer must not release the
// claim (the retry ran the effect again): the record is completed without
// the response, as when the store cannot hold it, and the client and
// every retry get 409 response-not-stored.
func TestResponseOverMaxResponseBytesCompletesWithoutIt(t *testing.T) {
	const limit = 1024
	m, err := httpdedup.New(httpdedup.Config{Dedup: dedup.Config{Store: memstore.New(nil)}, Identity: httpdedup.StaticIdentity("acct"), MaxResponseBytes: limit})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	var writeErr error
	h := m.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, writeErr = w.Write([]byte(strings.Repeat("x", limit+1)))
	}))
	notStored := httpdedup.DefaultProblemTypeBase + httpdedup.ProblemResponseNotStored
	first := post(h, "k-large", `{"amount":150}`)
	if first.Code != http.StatusConflict || problemType(t, first) != notStored {
		t.Errorf("first request: %d %s, want 409 %s", first.Code, first.Body, notStored)
	}
	if writeErr == nil {
		t.Error("the handler's Write past MaxResponseBytes returned no error")
	}
	retry := post(h, "k-large", `{"amount":150}`)
	if retry.Code != http.StatusConflict || problemType(t, retry) != notStored {
		t.Errorf("retry: %d %s, want 409 %s", retry.Code, retry.Body, notStored)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
	// A status the middleware does not store still releases the claim.
	h5xx := m.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusBadGateway)
		_, _ = w.Write([]byte(strings.Repeat("x", limit+1)))
	}))
	runs.Store(0)
	post(h5xx, "k-5xx", "")
	post(h5xx, "k-5xx", "")
	if n := runs.Load(); n != 2 {
		t.Errorf("a 502 over the limit: the handler ran %d times, want 2 (released each time)", n)
	}
}
