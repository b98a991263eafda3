package dedup

import "time"

// Clock is the time source of the middleware and of stores that use the
// client's clock (the memory store). Tests pass a fake (see dedup/fakeclock)
// so that leases, heartbeats and retention expire without sleeping.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a timer that fires once d has passed.
	NewTimer(d time.Duration) Timer
	// AfterFunc calls f in its own goroutine once d has passed, unless the
	// returned timer is stopped first. Its C channel is not used.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a one-shot timer from a Clock.
type Timer interface {
	// C returns the channel that receives the time when the timer fires.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it did.
	Stop() bool
}

// realClock is the wall clock, the default of Config.Clock.
type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) NewTimer(d time.Duration) Timer            { return realTimer{time.NewTimer(d)} }
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return realTimer{time.AfterFunc(d, f)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.t.C }
func (t realTimer) Stop() bool          { return t.t.Stop() }

// sleep waits d on clock.
func sleep(clock Clock, d time.Duration) {
	t := clock.NewTimer(d)
	defer t.Stop()
	<-t.C()
}
