package httpdedup_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
)

// With InProgressWait, a second request with the key in flight waits for
// the first instead of getting 409, and gets its response replayed; the
// handler runs once. Without the option the same request gets 409
// (TestInFlightKeyGets409ThenReplay).
func TestInFlightKeyWaitsAndGetsTheReplay(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		clock := newFakeClock()
		pay := &payments{}
		blocking := newBlockingHandler(pay)
		rec := &recorder{}
		// Polling: Redis would wake the waiting request at the first's
		// completion (see TestInFlightKeyWokenByRedis).
		m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: polling{store}, Clock: clock, Observer: rec, InProgressWait: 10 * time.Second, InProgressPoll: 50 * time.Millisecond}})
		srv := httptest.NewServer(m.Require(blocking))
		t.Cleanup(srv.Close)
		t.Cleanup(blocking.unblock)
		q := req{key: "k-inflight", body: `{"amount":1}`}

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
		// The first request's heartbeat and the second's pause.
		waitTimers(t, clock, 2)
		blocking.unblock()
		first := recv(t, "the first response", firstDone)
		if first.status != http.StatusCreated {
			t.Fatalf("first: %d %s", first.status, first.body)
		}
		clock.Advance(50 * time.Millisecond)
		second := recv(t, "the waiting request's response", secondDone)
		if second.status != http.StatusCreated || second.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(second.body, first.body) {
			t.Fatalf("waiting request: %d %q %s, want the replay of %s", second.status, second.header.Get("Idempotent-Replayed"), second.body, first.body)
		}
		if blocking.runs.Load() != 1 {
			t.Fatalf("handler ran %d times, want 1", blocking.runs.Load())
		}
		var waited time.Duration
		for _, d := range rec.all() {
			if d.Event == event.InProgress {
				t.Errorf("in_progress decided while waiting: %+v", d)
			}
			if d.Event == event.SkipDuplicate {
				waited = d.Waited
			}
		}
		if waited != 50*time.Millisecond {
			t.Errorf("the replay's decision waited %v, want 50ms", waited)
		}
	})
}

// After the wait, the request gets 409 as without the option.
func TestInFlightKeyWaitEndsIn409(t *testing.T) {
	forEachStore(t, func(t *testing.T, store dedup.Store) {
		clock := newFakeClock()
		blocking := newBlockingHandler(&payments{})
		m := newMiddleware(t, httpdedup.Config{Dedup: dedup.Config{Store: store, Clock: clock, InProgressWait: 100 * time.Millisecond, InProgressPoll: 100 * time.Millisecond}})
		srv := httptest.NewServer(m.Require(blocking))
		t.Cleanup(srv.Close)
		t.Cleanup(blocking.unblock)
		q := req{key: "k-inflight", body: `{"amount":1}`}
		firstReq := q.build(t, srv.URL)
		go func() { _, _ = send(srv, firstReq) }()
		recv(t, "the blocked handler to start", blocking.started)
		secondDone := make(chan response, 1)
		secondReq := q.build(t, srv.URL)
		go func() {
			r, _ := send(srv, secondReq)
			secondDone <- r
		}()
		waitTimers(t, clock, 2)
		clock.Advance(100 * time.Millisecond)
		wantProblem(t, recv(t, "the waiting request's response", secondDone), http.StatusConflict, httpdedup.ProblemRequestInProgress)
	})
}
