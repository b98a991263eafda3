// Package keywatch keeps the key watches of one store (a Watcher):
// which channels its waiters want, whether the server confirmed each
// subscription and since when, and which waiters to wake. The store's
// transport (a Redis subscription connection, a PostgreSQL LISTEN
// connection) runs in a goroutine the Hub starts at the first watch and
// that ends when nothing has been watched for a while, or when the store is
// closed; it subscribes to what Wanted lists and reports back with Active,
// Inactive, Notify and Unsubscribed.
//
// Every watch of a channel shares one subscription. A watch is woken when
// its channel's subscription becomes active (the server confirmed it, for
// the first time or after a reconnection: what happened before is unknown),
// when a notification arrives on it, and at once when it starts if its
// channel was active before its since and was notified after it, or became
// active after it.
package keywatch

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Watcher is an optional capability of a dedup.Store, found by a type
// assertion (a store outside this repository has it by having the
// method): it wakes a copy that waits for a held key
// (dedup.Config.InProgressWait) as soon as the key's record may have
// changed, so that the copy claims again at once instead of at its next
// poll, and N waiting copies cost the store N claims per change of the
// record instead of N per pause. stores/redis and stores/postgres
// implement it; a store without it is polled.
//
// A wake is never trusted for the outcome: it only makes the waiter claim
// again, and that claim decides. A store may wake a waiter for nothing (a
// forged or late announcement, a reconnection) and may fail to wake it (an
// announcement lost with a connection, a record changed by a process that
// does not announce, a lease that ended): the engine keeps claiming every
// dedup.Config.InProgressFallback as the safety net.
type Watcher interface {
	// WatchKey starts watching the record of key (the scoped key, as given
	// to Claim) and returns at once, without waiting for the store. Once
	// the watch is in place, wake receives a value (it is buffered; values
	// are coalesced) whenever a Complete or a Release of the key, by any
	// process, may have changed the record after since, a reading of
	// time.Now taken before the caller's last claim of the key was sent. A
	// watch that comes into place after since wakes the caller once, since
	// the store cannot tell what happened in between; so does a watch that
	// comes back after its connection was lost.
	//
	// wake is closed when the watch can no longer wake anyone (the store
	// was closed): the caller then polls. stop ends the watch and must be
	// called once the caller is done with it; it is idempotent and never
	// blocks on the store. An error means no watch: the caller polls.
	// Cost: no round trip of the caller's; the store shares one
	// subscription per key among every watch of the process.
	WatchKey(ctx context.Context, key string, since time.Time) (wake <-chan struct{}, stop func(), err error)
}

// ErrClosed is Watch's error once the Hub is closed.
var ErrClosed = errors.New("dedup: the store's key watches are closed")

// Run is a store's transport: it runs until ctx ends (the Hub is closed)
// or, at the Hub's Linger timer, until Hub.ExitIfIdle says nothing is
// wanted, and then closes its connections before returning.
type Run func(ctx context.Context, h *Hub)

// Hub is the watches of one store. Its zero value is not usable: see New.
type Hub struct {
	run    Run
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

// New returns a Hub whose transport is run; linger is how long the
// transport stays up with nothing watched.
func New(run Run, linger time.Duration) *Hub {
	ctx, cancel := context.WithCancel(context.Background())
	return &Hub{run: run, linger: linger, entries: map[string]*entry{}, changed: make(chan struct{}, 1), ctx: ctx, cancel: cancel}
}

// Linger is how long the transport stays up with nothing watched: it calls
// ExitIfIdle this long after the last change.
func (h *Hub) Linger() time.Duration { return h.linger }

// Watch starts a watch of channel for changes after since (see the package
// documentation) and starts the transport if it is not running. It never
// blocks on the server.
func (h *Hub) Watch(channel string, since time.Time) (<-chan struct{}, func(), error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, nil, ErrClosed
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

func (h *Hub) stop(channel string, w *watch) {
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
func (h *Hub) signal() {
	select {
	case h.changed <- struct{}{}:
	default:
	}
}

// Changed receives a value when the wanted set may have changed: the
// transport then compares Wanted with what it subscribed to.
func (h *Hub) Changed() <-chan struct{} { return h.changed }

// Wanted returns the channels that have watches.
func (h *Hub) Wanted() []string {
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
func (h *Hub) Active(channel string) {
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
func (h *Hub) Inactive(channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e := h.entries[channel]; e != nil {
		e.active = false
	}
}

// Notify reports a notification on channel: its watches are woken.
func (h *Hub) Notify(channel string) {
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
func (h *Hub) Unsubscribed(channel string) {
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
func (h *Hub) ExitIfIdle() bool {
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
func (h *Hub) Close() {
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

// Backoff is the pause before the attempt-th retry (from 0) of a
// transport's connection: 50ms doubling up to 2s.
func Backoff(attempt int) time.Duration {
	d := 50 * time.Millisecond
	for i := 0; i < attempt && d < 2*time.Second; i++ {
		d *= 2
	}
	return min(d, 2*time.Second)
}

// Sleep waits d or until ctx ends; it reports whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Watches returns how many watches are open, for tests.
func (h *Hub) Watches() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, e := range h.entries {
		n += len(e.watches)
	}
	return n
}
