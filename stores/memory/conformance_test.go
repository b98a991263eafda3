package memory_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/dedup/storetest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
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
	RecordDetails:     true,
	Watch:             true,
	Fencing:           true,
}

// realTime is features on the wall clock, with one store shared by every
// case.
var realTime = storetest.Features{ShortDuration: 20 * time.Millisecond, AlreadyCompleted: true, Admin: true, ListFillsPages: true,
	Provenance: true, CountsTakeovers: true, RecordDetails: true, Watch: true, Fencing: true}

func TestConformance(t *testing.T) { storetest.Run(t, newStore, features) }
func TestAdmin(t *testing.T)       { storetest.RunAdmin(t, newStore, features) }
func TestRouter(t *testing.T)      { storetest.RunRouter(t, newStore, features) }

// The store contract and the admin contract again on the wall clock, with
// one store shared by every case: the path a server-side store takes.
func TestConformanceRealTime(t *testing.T) {
	store := memstore.New(nil)
	shared := func(t *testing.T) (dedup.Store, func(time.Duration)) { return store, nil }
	t.Run("store", func(t *testing.T) { storetest.Run(t, shared, realTime) })
	t.Run("admin", func(t *testing.T) { storetest.RunAdmin(t, shared, realTime) })
}

// The router cases with the effect in the handler's transaction
// (Features.Transactions: TxMiddleware, and Tx.Set for the effect), on one
// store shared by every case, since the middleware is the store's.
// Every effect is written under a key of its own, so that an effect
// written twice (a rollback that wrote, a duplicate that ran) counts
// twice.
func TestRouterInTransaction(t *testing.T) {
	store := memstore.New(nil)
	var (
		seq     atomic.Int64
		mu      sync.Mutex
		written = map[string][]string{} // an effect's key → the keys its writes used
	)
	f := realTime
	f.Transactions = &storetest.Transactions{
		Middleware: store.TxMiddleware,
		Effect: func(msg *message.Message, key string) error {
			tx, ok := memory.TxFromContext(msg.Context())
			if !ok {
				return errors.New("no transaction in the handler's context")
			}
			k := fmt.Sprintf("%s#%d", key, seq.Add(1))
			mu.Lock()
			written[key] = append(written[key], k)
			mu.Unlock()
			return tx.Set(k, []byte(msg.UUID))
		},
		Effects: func(_ context.Context, key string) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, k := range written[key] {
				if _, ok := store.Get(k); ok {
					n++
				}
			}
			return n, nil
		},
	}
	storetest.RunRouter(t, func(*testing.T) (dedup.Store, func(time.Duration)) { return store, nil }, f)
}
