package httpdedup_test

import (
	"context"
	"net/http"
	"slices"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// TestShadowRunsEveryRequest: with Config.Shadow a retry of a completed key,
// a key reused for another body, a missing or malformed key on a Require
// route and an unidentified caller all reach the handler and get its own
// response (never a replay), logged would_skip or would_reject; the first
// request's record is completed as usual. A body over MaxBodyBytes is
// still refused.
func TestShadowRunsEveryRequest(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		rec := &recorder{}
		a := newAPI(t, store, httpdedup.Config{Dedup: dedup.Config{Shadow: true, Observer: rec}, MaxBodyBytes: 64})
		key := `"shadow-1"`
		for i, q := range []req{
			{key: key, body: `{"amount":1}`},
			{key: key, body: `{"amount":1}`}, // would be replayed
			{key: key, body: `{"amount":2}`}, // would be 422
			{body: `{"amount":3}`},           // would be 400 key-missing
			{key: `"abc`, body: `{}`},        // would be 400 key-invalid
			{key: `"other"`, account: "-"},   // would be 401
		} {
			r := mustSend(t, a.srv, q)
			if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("request %d: %d %s (replayed %q), want the handler's 201", i, r.status, r.body, r.header.Get("Idempotent-Replayed"))
			}
		}
		if n := a.pay.runs.Load(); n != 6 {
			t.Fatalf("handler ran %d times, want 6", n)
		}
		events := rec.events()
		for _, want := range []event.Event{event.ClaimWon, event.Completed, event.WouldSkip, event.WouldReject} {
			if !slices.Contains(events, want) {
				t.Errorf("decisions %v lack %s", events, want)
			}
		}
		if r := mustSend(t, a.srv, req{key: `"big"`, body: string(make([]byte, 100))}); r.status != http.StatusRequestEntityTooLarge {
			t.Fatalf("a body over MaxBodyBytes in shadow mode: %d, want 413", r.status)
		}
	})
}

// TestRequestIDIsKept: the record keeps the first request's X-Request-Id
// (Config.RequestID), and a replay does not change it.
func TestRequestIDIsKept(t *testing.T) {
	store := memstore.New(nil)
	a := newAPI(t, store, httpdedup.Config{})
	for _, id := range []string{"req-1", "req-2"} {
		mustSend(t, a.srv, req{key: `"k-1"`, body: `{}`, header: http.Header{"X-Request-Id": {id}}})
	}
	r, err := store.Inspect(context.Background(), admin.ScopedKey(httpdedup.Scope("acct_1", http.MethodPost, "/payments"), "k-1"))
	if err != nil || r.TransportID != "req-1" || r.Claims != 1 || r.State != admin.StateCompleted {
		t.Fatalf("record %+v %v, want completed, first claimed by req-1", r, err)
	}
}
