package storekit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

// transport is a test transport: it records what it was asked and
// exits when idle.
type transport struct {
	mu    sync.Mutex
	runs  int
	h     chan *storekit.WatchHub
	ended chan struct{}
}

func (tr *transport) run(ctx context.Context, h *storekit.WatchHub) {
	tr.mu.Lock()
	tr.runs++
	tr.mu.Unlock()
	tr.h <- h
	t := time.NewTimer(h.Linger())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			tr.ended <- struct{}{}
			return
		case <-h.Changed():
			t.Reset(h.Linger())
		case <-t.C:
			if h.ExitIfIdle() {
				tr.ended <- struct{}{}
				return
			}
			t.Reset(h.Linger())
		}
	}
}

func newHub(linger time.Duration) (*storekit.WatchHub, *transport) {
	tr := &transport{h: make(chan *storekit.WatchHub, 10), ended: make(chan struct{}, 10)}
	return storekit.NewWatchHub(tr.run, linger), tr
}

func woken(c <-chan struct{}) bool {
	select {
	case _, ok := <-c:
		return ok
	default:
		return false
	}
}

func recv[T any](t *testing.T, what string, c <-chan T) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("waited a minute for %s", what)
		panic("unreachable")
	}
}

// A watch is woken when its subscription comes into place (the store
// cannot tell what happened before), by each notification, and again
// when its subscription comes back after a loss.
func TestWakes(t *testing.T) {
	h, tr := newHub(time.Hour)
	defer h.Close()
	c, stop, err := h.Watch("k", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	recv(t, "the transport to start", tr.h)
	if got := h.Wanted(); len(got) != 1 || got[0] != "k" {
		t.Fatalf("Wanted %v, want [k]", got)
	}
	if woken(c) {
		t.Fatal("woken before the subscription is in place")
	}
	h.Active("k")
	if !woken(c) {
		t.Fatal("not woken when the subscription came into place")
	}
	h.Notify("k")
	if !woken(c) {
		t.Fatal("not woken by a notification")
	}
	h.Notify("other")
	if woken(c) {
		t.Fatal("woken by another channel's notification")
	}
	h.Inactive("k")
	h.Active("k")
	if !woken(c) {
		t.Fatal("not woken when the subscription came back")
	}
}

// A watch of a channel already subscribed is woken at once only if the
// subscription came into place, or a notification arrived, at or after
// its since.
func TestSinceOnAnActiveChannel(t *testing.T) {
	h, _ := newHub(time.Hour)
	defer h.Close()
	_, stop, _ := h.Watch("k", time.Now())
	defer stop()
	h.Active("k")
	after := time.Now().Add(time.Nanosecond) // strictly after the confirmation
	c, stop2, _ := h.Watch("k", after)
	defer stop2()
	if woken(c) {
		t.Fatal("woken although nothing happened since its since")
	}
	before := after.Add(-time.Hour)
	c3, stop3, _ := h.Watch("k", before)
	defer stop3()
	if !woken(c3) {
		t.Fatal("not woken although the subscription came into place after its since")
	}
	h.Notify("k")
	c4, stop4, _ := h.Watch("k", after)
	defer stop4()
	if !woken(c4) {
		t.Fatal("not woken although a notification arrived after its since")
	}
}

// The transport exits once nothing is watched at its linger timer, and
// starts again with the next watch; Close ends it and closes the watches
// still open; later watches are refused.
func TestLifecycle(t *testing.T) {
	h, tr := newHub(time.Millisecond)
	_, stop, _ := h.Watch("k", time.Now())
	recv(t, "the transport to start", tr.h)
	stop()
	recv(t, "the idle transport to end", tr.ended)
	c, _, _ := h.Watch("k", time.Now())
	recv(t, "the transport to start again", tr.h)
	h.Close()
	if _, ok := <-c; ok {
		t.Fatal("a watch still open was not closed by Close")
	}
	if _, _, err := h.Watch("k", time.Now()); !errors.Is(err, storekit.ErrWatchesClosed) {
		t.Fatalf("Watch after Close: %v, want ErrClosed", err)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.runs != 2 {
		t.Fatalf("%d runs, want 2", tr.runs)
	}
}

// Unsubscribed forgets a channel nobody watches, and keeps one watched
// again meanwhile, inactive until it is subscribed again.
func TestUnsubscribedKeepsARewatchedChannel(t *testing.T) {
	h, _ := newHub(time.Hour)
	defer h.Close()
	_, stop, _ := h.Watch("k", time.Now())
	h.Active("k")
	stop()
	if got := h.Wanted(); len(got) != 0 {
		t.Fatalf("Wanted %v after the last watch stopped, want none", got)
	}
	c, stop2, _ := h.Watch("k", time.Now())
	defer stop2()
	woken(c)
	h.Unsubscribed("k")
	if got := h.Wanted(); len(got) != 1 {
		t.Fatalf("Wanted %v, want [k]: it is watched again", got)
	}
	h.Active("k")
	if !woken(c) {
		t.Fatal("not woken when subscribed again")
	}
}
