package httpdedup_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// lostReplyStore completes the record on the real store, then reports the
// first Complete as failed, as when the reply is lost on the way back.
type lostReplyStore struct {
	dedup.Store
	lost atomic.Bool
}

var errReplyLost = errors.New("reply lost")

func (s *lostReplyStore) Complete(ctx context.Context, c dedup.Claim, result []byte, retention time.Duration) error {
	err := s.Store.Complete(ctx, c, result, retention)
	if err == nil && s.lost.CompareAndSwap(false, true) {
		return errReplyLost
	}
	return err
}

// Issue 13, failure 2: when the first Complete succeeded but its reply was
// lost, the retry gets ErrAlreadyCompleted. The Watermill middleware counted
// it as completed; httpdedup logged an error-level claim_lost ("taken
// over"). Both now count it as completed, on a real redis-server (which
// tells that case apart).
func TestLostCompleteReplyCountsAsCompleted(t *testing.T) {
	store, _ := backends[0].new(t, nil) // redis
	rec := &recorder{}
	a := newAPI(t, &lostReplyStore{Store: store}, httpdedup.Config{Dedup: dedup.Config{Observer: rec, CompleteBackoff: time.Millisecond}})
	if r := mustSend(t, a.srv, req{key: "k-lost-reply", body: "x"}); r.status != http.StatusCreated {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	var events []event.Event
	for _, d := range rec.all() {
		if d.Op == "complete" {
			events = append(events, d.Event)
		}
	}
	if len(events) != 1 || events[0] != event.Completed {
		t.Fatalf("complete decisions %v, want one %q", events, event.Completed)
	}
	if r := mustSend(t, a.srv, req{key: "k-lost-reply", body: "x"}); r.header.Get("Idempotent-Replayed") != "true" || a.pay.runs.Load() != 1 {
		t.Fatalf("retry: %d, replayed %q, runs %d; want a replay of the one run", r.status, r.header.Get("Idempotent-Replayed"), a.pay.runs.Load())
	}
}

// Issue 14, item 5: a handler that returns without writing (after the
// client hung up, say) was stored as an empty 200 and replayed with
// Idempotent-Replayed: true for the whole retention, so the effect never
// happened. A response the handler never wrote releases the claim.
func TestUnwrittenResponseIsNotStored(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store}})
		var runs atomic.Int64
		h := m.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if runs.Add(1) == 1 {
				return // gave up without writing anything
			}
			w.WriteHeader(http.StatusCreated)
		}))
		q := req{key: "k-unwritten", body: "x"}
		if r := serve(t, h, q); r.status != http.StatusOK || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("first: %d, replayed %q; want net/http's empty 200, not marked", r.status, r.header.Get("Idempotent-Replayed"))
		}
		if r := serve(t, h, q); r.status != http.StatusCreated || runs.Load() != 2 {
			t.Fatalf("retry: %d after %d runs; want the handler to run again (201)", r.status, runs.Load())
		}
	})
}

// Issue 14, item 6: with the middleware around a whole ServeMux there is no
// pattern yet, and the decisions' Handler (a metrics label) was the raw
// path: 50 requests to one route gave 100 decisions_total series. It is
// bounded now: the method and the pattern, or "*".
func TestDecisionHandlerLabelIsBounded(t *testing.T) {
	rec := &recorder{}
	m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: memstore.New(nil), Observer: rec}})
	mux := http.NewServeMux()
	mux.Handle("POST /payments/{id}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	h := m.Require(mux)
	for i := range 50 {
		if r := serve(t, h, req{key: fmt.Sprint("k-", i), path: fmt.Sprint("/payments/", i), body: "x"}); r.status != http.StatusCreated {
			t.Fatalf("request %d: %d", i, r.status)
		}
	}
	series := map[string]bool{}
	for _, d := range rec.all() {
		series[d.Handler+"|"+string(d.Event)] = true
	}
	if len(series) != 2 || !series["POST *|claim_won"] || !series["POST *|completed"] {
		t.Fatalf("%d (handler, event) series for 50 requests to one route: %v; want 2 (POST *)", len(series), series)
	}
}
