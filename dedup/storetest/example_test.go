package storetest_test

import (
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/dedup/storetest"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// A store's whole test of the contract: a constructor and the Features it
// declares. This is stores/memory's; a store whose expiry runs on a server
// returns the same store to every case and a nil advance, and leaves
// ControllableClock unset. (An example cannot run a suite, which needs a
// *testing.T: `go test ./stores/memory` runs this one.)
func Example() {
	newStore := func(t *testing.T) (dedup.Store, func(time.Duration)) {
		clock := fakeclock.New(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
		store, err := memory.New(t.Context(), memory.Config{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		return store, clock.Advance // a store and a clock of its own per case
	}
	features := storetest.Features{
		ControllableClock: true, // exact deadlines and Remaining
		AlreadyCompleted:  true, // a retried Complete says ErrAlreadyCompleted
		Admin:             true, // implements admin.Interface
		ListFillsPages:    true,
	}
	_ = func(t *testing.T) { // func TestConformance(t *testing.T)
		storetest.Run(t, newStore, features)
		storetest.RunAdmin(t, newStore, features)
		storetest.RunRouter(t, newStore, features)
	}
}

// One case on its own, as every case is exported: here the race for one
// key with more contenders than Run uses.
func ExampleTestOneWinnerAmongContenders() {
	_ = func(t *testing.T) {
		store, err := memory.New(t.Context(), memory.Config{})
		if err != nil {
			t.Fatal(err)
		}
		storetest.TestOneWinnerAmongContenders(t, func(*testing.T) (dedup.Store, func(time.Duration)) {
			return store, nil
		}, storetest.Features{Contenders: 1000})
	}
}
