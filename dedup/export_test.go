package dedup

import "unsafe"

// SetTestHookOpTimedOut sets testHookOpTimedOut for the external tests;
// nil removes it.
func SetTestHookOpTimedOut(f func()) {
	if f == nil {
		testHookOpTimedOut.Store(nil)
		return
	}
	testHookOpTimedOut.Store(&f)
}

// MinLease is the shortest Config.Lease that New accepts.
const MinLease = minLease

// DeliverySize is the size of the middleware's allocation per message.
const DeliverySize = unsafe.Sizeof(delivery{})

// RememberedRefusals is how many messages e's log of refusals remembers.
func RememberedRefusals(e *Engine) int { return e.repeats.remembered() }

// RepeatMessages bounds RememberedRefusals.
const RepeatMessages = repeatMessages
