// Package poll waits, in real time and bounded, for what other goroutines,
// child processes or servers do: it is not a clock, and a slow machine
// only makes it wait longer.
package poll

import (
	"testing"
	"time"
)

// Until checks cond every millisecond until it holds or bound has passed,
// and reports whether it held.
func Until(bound time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(bound); !cond(); {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// Wait is Until, and ends the test naming what it waited for when cond
// did not hold within bound. Call it from the test's goroutine.
func Wait(t testing.TB, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Until(bound, cond) {
		t.Fatalf("waited %v for %s", bound, what)
	}
}
