package storekit

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrWatchesClosed is WatchHub.Watch's error once the hub is closed.
var ErrWatchesClosed = errors.New("dedup: the store's key watches are closed")

// WatchTransport is a store's transport: it runs until ctx ends (the hub
// is closed) or, at the hub's Linger timer, until WatchHub.ExitIfIdle says
// nothing is wanted, and then closes its connections before returning.
type WatchTransport func(ctx context.Context, h *WatchHub)

// WatchHub keeps the key watches of one store that has the
// dedup.KeyWatcher capability: which channels its waiters want, whether
// the server confirmed each subscription and since when, and which waiters
// to wake. The store's transport (a Redis subscription connection, a
// PostgreSQL LISTEN connection) runs in a goroutine the hub starts at the
// first watch and that ends when nothing has been watched for a while, or
// when the store is closed; it subscribes to what Wanted lists and reports
// back with Active, Inactive, Notify and Unsubscribed.
//
// Every watch of a channel shares one subscription. A watch is woken when
// its channel's subscription becomes active (the server confirmed it, for
// the first time or after a reconnection: what happened before is unknown),
// when a notification arrives on it, and at once when it starts if its
// channel was active before its since and was notified after it, or became
// active after it.
//
// Its zero value is not usable: see NewWatchHub.
type WatchHub struct {
	run    WatchTransport
	linger time.Duration

	mu      sync.Mutex
	entries map[string]*entry
	changed chan struct{} // buffered 1: the wanted set changed
	running bool
	closed  bool
	ctx     context.Context
	cancel  context.CancelFunc
	runs    sync.WaitGroup
}

// entry is one channel.
type entry struct {
	watches   map[*watch]struct{}
	active    bool
	activeAt  time.Time // when the subscription was last confirmed
	lastEvent time.Time // last notification or confirmation
}

type watch struct{ c chan struct{} }

func (w *watch) wake() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// NewWatchHub returns a WatchHub whose transport is run; linger is how long the
// transport stays up with nothing watched.
func NewWatchHub(run WatchTransport, linger time.Duration) *WatchHub {
	ctx, cancel := context.WithCancel(context.Background())
	return &WatchHub{run: run, linger: linger, entries: map[string]*entry{}, changed: make(chan struct{}, 1), ctx: ctx, cancel: cancel}
}

// Linger is how long the transport stays up with nothing watched: it calls
// ExitIfIdle this long after the last change.
func (h *WatchHub) Linger() time.Duration { return h.linger }

// Watch starts a watch of channel for changes after since (see the package
// documentation) and starts the transport if it is not running. It never
// blocks on the server.
func (h *WatchHub) Watch(channel string, since time.Time) (<-chan struct{}, func(), error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, nil, ErrWatchesClosed
	}
	e := h.entries[channel]
	if e == nil {
		e = &entry{watches: map[*watch]struct{}{}}
		h.entries[channel] = e
	}
	w := &watch{c: make(chan struct{}, 1)}
	e.watches[w] = struct{}{}
	if e.active && (e.activeAt.After(since) || !e.lastEvent.Before(since)) {
		w.wake()
	}
	if len(e.watches) == 1 {
		h.signal()
	}
	if !h.running {
		h.running = true
		h.runs.Add(1)
		go func() {
			defer h.runs.Done()
			h.run(h.ctx, h)
		}()
	}
	var once sync.Once
	return w.c, func() { once.Do(func() { h.stop(channel, w) }) }, nil
}

func (h *WatchHub) stop(channel string, w *watch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.entries[channel]
	if e == nil {
		return
	}
	delete(e.watches, w)
	if len(e.watches) == 0 {
		h.signal()
	}
}

// signal tells the transport that the wanted set changed. h.mu held.
func (h *WatchHub) signal() {
	select {
	case h.changed <- struct{}{}:
	default:
	}
}

// Changed receives a value when the wanted set may have changed: the
// transport then compares Wanted with what it subscribed to.
func (h *WatchHub) Changed() <-chan struct{} { return h.changed }

// Wanted returns the channels that have watches.
func (h *WatchHub) Wanted() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.entries))
	for name, e := range h.entries {
		if len(e.watches) > 0 {
			out = append(out, name)
		}
	}
	return out
}

// Active reports that the server confirmed the subscription of channel:
// its watches are woken (they may have missed a change before).
func (h *WatchHub) Active(channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e := h.entries[channel]; e != nil {
		now := time.Now()
		e.active, e.activeAt, e.lastEvent = true, now, now
		for w := range e.watches {
			w.wake()
		}
	}
}

// Inactive reports that the subscription of channel is lost (its
// connection broke, or the server dropped it); the next Active wakes its
// watches.
func (h *WatchHub) Inactive(channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e := h.entries[channel]; e != nil {
		e.active = false
	}
}

// Notify reports a notification on channel: its watches are woken.
func (h *WatchHub) Notify(channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e := h.entries[channel]; e != nil {
		e.lastEvent = time.Now()
		for w := range e.watches {
			w.wake()
		}
	}
}

// Unsubscribed reports that the transport unsubscribed from channel (it
// was no longer wanted): the channel is forgotten unless it has watches
// again, in which case it is inactive until subscribed again.
func (h *WatchHub) Unsubscribed(channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e := h.entries[channel]; e != nil {
		if len(e.watches) == 0 {
			delete(h.entries, channel)
		} else {
			e.active = false
			h.signal()
		}
	}
}

// ExitIfIdle reports whether nothing is watched; if so the transport must
// close its connections and return, and the next Watch starts it again.
func (h *WatchHub) ExitIfIdle() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range h.entries {
		if len(e.watches) > 0 {
			return false
		}
	}
	clear(h.entries)
	h.running = false
	return true
}

// Close ends the transport and waits for it to return, then closes every
// watch's channel (the waiters poll) and refuses new watches.
func (h *WatchHub) Close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	h.mu.Unlock()
	h.cancel()
	h.runs.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range h.entries {
		for w := range e.watches {
			close(w.c)
		}
	}
	clear(h.entries)
}

// WatchBackoff is the pause before the attempt-th retry (from 0) of a
// transport's connection: 50ms doubling up to 2s.
func WatchBackoff(attempt int) time.Duration {
	d := 50 * time.Millisecond
	for i := 0; i < attempt && d < 2*time.Second; i++ {
		d *= 2
	}
	return min(d, 2*time.Second)
}

// SleepCtx waits d or until ctx ends; it reports whether ctx is still
// live. For a transport's pause before it reconnects.
func SleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Watches returns how many watches are open (for tests and metrics).
func (h *WatchHub) Watches() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, e := range h.entries {
		n += len(e.watches)
	}
	return n
}
