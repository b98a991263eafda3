package dedup

import "time"

// Clock is the time source of the engine and of stores that use the
// client's clock (the memory store, the DynamoDB store). Tests pass a fake
// (see dedup/fakeclock) so that leases, heartbeats and retention expire
// without sleeping. A nil Clock in a Config is the wall clock.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed, unless
	// stop is called first; stop reports whether it prevented the call.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// realClock is the wall clock, the default of Config.Clock.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }

// sleep waits d on clock.
func sleep(clock Clock, d time.Duration) {
	done := make(chan struct{})
	clock.AfterFunc(d, func() { close(done) })
	<-done
}
