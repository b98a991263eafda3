package fakeclock_test

import (
	"context"
	"fmt"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// A lease expires when the test says so: the memory store (or the
// DynamoDB store's Config.Clock, or dedup.Config.Clock) reads the fake
// clock, and nothing sleeps.
func Example() {
	clock := fakeclock.New(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	store, err := memory.New(context.Background(), memory.Config{Clock: clock})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	claim := func() {
		res, err := store.Claim(ctx, "charge-orders:ORDER-003", "", 30*time.Second)
		if err != nil {
			panic(err)
		}
		fmt.Println(clock.Now().Format("15:04:05"), res.Outcome)
	}
	claim()
	clock.Advance(29 * time.Second)
	claim() // the first claim still holds the key
	clock.Advance(time.Second)
	claim() // its lease has ended: taken over
	// Output:
	// 12:00:00 acquired
	// 12:00:29 in_progress
	// 12:00:30 acquired
}

// A timer fires, in its own goroutine, when Advance reaches its deadline.
// WaitForTimers lets a test wait until code under test has set its timer
// before moving time.
func ExampleClock_AfterFunc() {
	clock := fakeclock.New(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	fired := make(chan time.Time, 1)
	var _ dedup.Clock = clock
	go clock.AfterFunc(10*time.Second, func() { fired <- clock.Now() })

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := clock.WaitForTimers(ctx, 1); err != nil {
		panic(err)
	}
	clock.Advance(9 * time.Second)
	fmt.Println("pending after 9s:", clock.Timers())
	clock.Advance(time.Second)
	select {
	case at := <-fired:
		fmt.Println("fired at", at.Format("15:04:05"))
	case <-ctx.Done():
		panic("the timer did not fire within a minute")
	}
	// Output:
	// pending after 9s: 1
	// fired at 12:00:10
}
