package memory_test

import (
	"time"

	"testing"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storetest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

func batchFeatures() storetest.Features {
	f := features
	f.Batch = true
	return f
}

func TestBatchConformance(t *testing.T) { storetest.RunBatch(t, newStore, batchFeatures()) }

// The batch cases again on the wall clock, with one store shared by every
// case.
func TestBatchConformanceRealTime(t *testing.T) {
	store := memstore.New(nil)
	f := batchFeatures()
	f.ControllableClock = false
	storetest.RunBatch(t, func(t *testing.T) (dedup.Store, func(time.Duration)) { return store, nil }, f)
}
