package memory_test

import (
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/dedup/storetest"
	"github.com/watermill-dedup/watermill-dedup/internal/memstore"
)

var epoch = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// Each case gets a store of its own on a fake clock: expiry needs no
// sleeping, and the deadlines are exact.
func newStore(t *testing.T) (dedup.Store, func(time.Duration)) {
	clock := fakeclock.New(epoch)
	return memstore.New(clock), clock.Advance
}

var features = storetest.Features{
	ControllableClock: true,
	AlreadyCompleted:  true,
	Admin:             true,
	ListFillsPages:    true,
	Provenance:        true,
	CountsTakeovers:   true,
}

func TestConformance(t *testing.T) { storetest.Run(t, newStore, features) }
func TestAdmin(t *testing.T)       { storetest.RunAdmin(t, newStore, features) }
func TestRouter(t *testing.T)      { storetest.RunRouter(t, newStore, features) }

// The store contract and the admin contract again on the wall clock, with
// one store shared by every case: the path a server-side store takes.
func TestConformanceRealTime(t *testing.T) {
	store := memstore.New(nil)
	shared := func(t *testing.T) (dedup.Store, func(time.Duration)) { return store, nil }
	realTime := storetest.Features{ShortDuration: 20 * time.Millisecond, AlreadyCompleted: true, Admin: true, ListFillsPages: true,
		Provenance: true, CountsTakeovers: true}
	t.Run("store", func(t *testing.T) { storetest.Run(t, shared, realTime) })
	t.Run("admin", func(t *testing.T) { storetest.RunAdmin(t, shared, realTime) })
}
