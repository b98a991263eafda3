package httpdedup_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
)

// polling is a store with only the dedup.Store methods: a wait on it polls
// even where the store could wake it (its WatchKey method).
type polling struct{ dedup.Store }

// On Redis, a request waiting for the same key in flight is woken by the
// first request's completion (announced by the completing script): it gets
// the replay without the middleware's clock moving.
func TestInFlightKeyWokenByRedis(t *testing.T) {
	store, _ := backends[0].new(t, nil) // redis
	clock := newFakeClock()
	blocking := newBlockingHandler(&payments{})
	m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store, Clock: clock, InProgressWait: 10 * time.Second}})
	srv := httptest.NewServer(m.Require(blocking))
	t.Cleanup(srv.Close)
	t.Cleanup(blocking.unblock)
	q := req{key: "k-woken", body: `{"amount":1}`}
	firstDone := make(chan response, 1)
	firstReq := q.build(t, srv.URL)
	go func() {
		r, _ := send(srv, firstReq)
		firstDone <- r
	}()
	recv(t, "the blocked handler to start", blocking.started)
	secondDone := make(chan response, 1)
	secondReq := q.build(t, srv.URL)
	go func() {
		r, _ := send(srv, secondReq)
		secondDone <- r
	}()
	waitTimers(t, clock, 2) // the first request's heartbeat and the second's pause
	blocking.unblock()
	first := recv(t, "the first response", firstDone)
	second := recv(t, "the waiting request's response, woken", secondDone)
	if second.status != http.StatusCreated || second.header.Get("Idempotent-Replayed") != "true" || string(second.body) != string(first.body) {
		t.Fatalf("waiting request: %d %q %s, want the replay of %s", second.status, second.header.Get("Idempotent-Replayed"), second.body, first.body)
	}
	if blocking.runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", blocking.runs.Load())
	}
}
