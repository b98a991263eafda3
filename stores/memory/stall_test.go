package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/storetest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// stalling stands for a loaded machine on the wall clock: every Claim,
// Extend and Inspect starts only after a pause longer than the suite's
// ShortDuration, as a garbage collection or a descheduled test goroutine
// on a busy 2-core machine does. A case that needs two calls to fall
// within ShortDuration of each other fails here (three did, before they
// were made to tell such a stall from a store's fault).
type stalling struct{ *memory.Store }

const stall = 25 * time.Millisecond // above ShortDuration below

func (s stalling) Claim(ctx context.Context, key, fingerprint string, lease time.Duration) (dedup.ClaimResult, error) {
	time.Sleep(stall)
	return s.Store.Claim(ctx, key, fingerprint, lease)
}

func (s stalling) Extend(ctx context.Context, c dedup.Claim, lease time.Duration) error {
	time.Sleep(stall)
	return s.Store.Extend(ctx, c, lease)
}

func (s stalling) Inspect(ctx context.Context, key string) (admin.Record, error) {
	time.Sleep(stall)
	return s.Store.Inspect(ctx, key)
}

func TestConformanceSurvivesStalls(t *testing.T) {
	newStore := func(t *testing.T) (dedup.Store, func(time.Duration)) { return stalling{memstore.New(nil)}, nil }
	f := realTime
	f.Contenders, f.DistinctKeys = 8, 8
	t.Run("store", func(t *testing.T) { storetest.Run(t, newStore, f) })
	t.Run("admin", func(t *testing.T) { storetest.RunAdmin(t, newStore, f) })
}
