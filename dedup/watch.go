package dedup

import (
	"context"
	"time"
)

// KeyWatcher is an optional capability of a Store: it wakes a copy that
// waits for a held key (Config.InProgressWait) as soon as the key's record
// may have changed, so that the copy claims again at once instead of at its
// next poll, and N waiting copies cost the store N claims per change of the
// record instead of N per pause. stores/redis and stores/postgres implement
// it; a store without it is polled.
//
// A wake is never trusted for the outcome: it only makes the waiter claim
// again, and that claim decides. A store may wake a waiter for nothing (a
// forged or late announcement, a reconnection) and may fail to wake it (an
// announcement lost with a connection, a record changed by a process that
// does not announce, a lease that ended): the engine keeps claiming every
// Config.InProgressFallback as the safety net.
type KeyWatcher interface {
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

// defaultInProgressFallback is Config.InProgressFallback's default.
const defaultInProgressFallback = time.Second

// watchHolder starts a watch of the flight's key for awaitHolder when the
// store can wake waiters; it returns a nil channel and a no-op stop when it
// cannot (no capability, or the store refused), and the wait polls.
func (f *flight) watchHolder(ctx context.Context) (<-chan struct{}, func()) {
	w, ok := f.e.cfg.Store.(KeyWatcher)
	if !ok {
		return nil, func() {}
	}
	wake, stop, err := w.WatchKey(ctx, f.hc.Key, f.wait.claimSent)
	if err != nil || wake == nil {
		return nil, func() {}
	}
	return wake, stop
}

// pauseEnd is how a pause of a wait ended.
type pauseEnd uint8

const (
	pauseElapsed   pauseEnd = iota // the pause's time passed
	pauseWoken                     // the store's watch woke the waiter
	pauseUnwatched                 // the store's watch ended: poll from now on
	pauseCancelled                 // ctx ended
)

// pauseOrWake waits d on clock, or until wake has a value or is closed
// (a nil wake never does); ctx ending cuts it short.
func pauseOrWake(ctx context.Context, clock Clock, d time.Duration, wake <-chan struct{}) pauseEnd {
	done := make(chan struct{})
	stop := clock.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
		return pauseElapsed
	case _, ok := <-wake:
		stop()
		if !ok {
			return pauseUnwatched
		}
		return pauseWoken
	case <-ctx.Done():
		stop()
		return pauseCancelled
	}
}
