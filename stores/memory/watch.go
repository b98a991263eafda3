package memory

import (
	"context"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

var _ dedup.KeyWatcher = (*Store)(nil)

// watch is one WatchKey: its channel is buffered, so that wakes coalesce
// and never block the store.
type watch struct{ c chan struct{} }

func (w *watch) wake() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// WatchKey implements [dedup.KeyWatcher]: the engine's waiters of
// dedup.Config.InProgressWait are woken as soon as the key's record is
// completed or released in this store (by Complete, Release, their batch
// forms, a RunInTx's completion) or evicted, in the same step, under the
// store's mutex; no transport is involved. The watch is in place when
// WatchKey returns, and it wakes its caller at once when the record may
// have changed since the caller's claim: when the key holds no record in
// progress (it was completed, released, evicted, or its lease or
// retention ended), or holds one that took over a released or abandoned
// record (its Claims count is above 1). The store keeps no history of a
// key, only its record, so since is not needed: a wake for nothing costs
// the waiter one claim, and a record completed, expired and claimed again
// between the caller's claim and its watch (a retention shorter than that
// interval) is not reported. A lease that ends wakes nobody (the store has
// no timers): the waiter's fallback poll finds it.
//
// stop is idempotent and only takes the store's mutex. After Close, the
// watches' channels are closed and WatchKey fails with
// storekit.ErrWatchesClosed. Cost: a few small allocations per watch; a
// Complete or Release of a key nobody watches pays one length check.
func (s *Store) WatchKey(_ context.Context, key string, since time.Time) (<-chan struct{}, func(), error) {
	w := &watch{c: make(chan struct{}, 1)}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, storekit.ErrWatchesClosed
	}
	if s.watches == nil {
		s.watches = map[string]map[*watch]struct{}{}
	}
	ws := s.watches[key]
	if ws == nil {
		ws = map[*watch]struct{}{}
		s.watches[key] = ws
	}
	ws[w] = struct{}{}
	if r := s.records[key]; r == nil || !r.isLive(now) || r.completed || r.claims > 1 {
		w.wake()
	}
	return w.c, func() { s.unwatch(key, w) }, nil
}

// unwatch ends w, a watch of key; a watch already ended (or closed by
// Close) is left alone.
func (s *Store) unwatch(key string, w *watch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := s.watches[key]
	if _, ok := ws[w]; !ok {
		return
	}
	delete(ws, w)
	if len(ws) == 0 {
		delete(s.watches, key)
	}
}

// wake wakes every watch of key. s.mu held.
func (s *Store) wake(key string) {
	if len(s.watches) == 0 { // nobody watches any key: the usual case
		return
	}
	for w := range s.watches[key] {
		w.wake()
	}
}

// Close ends the store's watches: the channel of every open watch is
// closed (its waiter polls from then on) and later WatchKey calls fail
// with storekit.ErrWatchesClosed, as a network store's Close does. Every
// other method keeps working; the store holds nothing else to release (it
// starts no goroutine). Calling it more than once is safe; it returns nil.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	for _, ws := range s.watches {
		for w := range ws {
			close(w.c)
		}
	}
	s.watches = nil
	return nil
}
