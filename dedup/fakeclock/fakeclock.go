// Package fakeclock is a manual [dedup.Clock] for tests: time moves only when
// the test calls Advance, so leases, heartbeats and retention windows expire
// deterministically and no test sleeps to wait for them.
package fakeclock

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// Clock is a manually advanced clock. It is safe for concurrent use. Create it
// with New; the zero value is not usable.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*timer
	changed chan struct{} // closed and replaced whenever the pending timers change
}

var _ dedup.Clock = (*Clock)(nil)

type timer struct {
	c  *Clock
	at time.Time
	f  func() // called in its own goroutine when the timer fires
}

// New returns a clock showing start.
func New(start time.Time) *Clock {
	return &Clock{now: start, changed: make(chan struct{})}
}

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc calls f in its own goroutine once Advance has moved the clock d
// or more past the current time (d <= 0: at once).
func (c *Clock) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{c: c, at: c.now.Add(d), f: f}
	if d <= 0 {
		go f()
		return t.stop
	}
	c.timers = append(c.timers, t)
	c.notify()
	return t.stop
}

// stop removes the timer; it reports whether the timer was still pending.
func (t *timer) stop() bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, p := range c.timers {
		if p == t {
			c.timers = append(c.timers[:i], c.timers[i+1:]...)
			c.notify()
			return true
		}
	}
	return false
}

// Advance moves the clock forward by d and fires, in deadline order, every
// timer whose deadline has been reached.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	sort.SliceStable(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
	var kept []*timer
	for _, t := range c.timers {
		if !t.at.After(c.now) {
			go t.f()
			continue
		}
		kept = append(kept, t)
	}
	c.timers = kept
	c.notify()
}

// Timers returns how many timers are pending.
func (c *Clock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// WaitForTimers blocks until at least n timers are pending, or ctx ends (then
// it returns ctx.Err()). Tests call it before Advance so that a goroutine's
// timer is registered before time moves.
func (c *Clock) WaitForTimers(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		if len(c.timers) >= n {
			c.mu.Unlock()
			return nil
		}
		changed := c.changed
		c.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// WaitForTimerAt blocks until a timer due exactly at is pending, or ctx
// ends (then it returns ctx.Err()). It tells one timer from another where
// counting them cannot: the engine's next heartbeat from the deadline timer
// it keeps while an extension is in flight.
func (c *Clock) WaitForTimerAt(ctx context.Context, at time.Time) error {
	for {
		c.mu.Lock()
		for _, t := range c.timers {
			if t.at.Equal(at) {
				c.mu.Unlock()
				return nil
			}
		}
		changed := c.changed
		c.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("no timer due at %s (now %s): %w", at.Format(time.RFC3339Nano), c.Now().Format(time.RFC3339Nano), ctx.Err())
		}
	}
}

func (c *Clock) notify() {
	close(c.changed)
	c.changed = make(chan struct{})
}
