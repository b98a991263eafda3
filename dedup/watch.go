package dedup

import (
	"context"
	"time"
)

// defaultInProgressFallback is Config.InProgressFallback's default.
const defaultInProgressFallback = time.Second

// watchHolder starts a watch of the call's key for awaitHolder when the
// store can wake waiters; it returns a nil channel and a no-op stop when it
// cannot (no capability, or the store refused), and the wait polls.
func (c *callRun) watchHolder(ctx context.Context) (<-chan struct{}, func()) {
	w, ok := c.e.cfg.Store.(KeyWatcher)
	if !ok {
		return nil, func() {}
	}
	wake, stop, err := w.WatchKey(ctx, c.held.key, c.wait.claimSent)
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
