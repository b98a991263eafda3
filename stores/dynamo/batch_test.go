package dynamo_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup/storetest"
	"github.com/watermill-dedup/watermill-dedup/internal/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

func batchFeatures(t *testing.T) storetest.Features {
	f := features(t)
	f.Batch, f.BatchRequestSize = true, dynamo.BatchConcurrency
	return f
}

// The batch cases on dynalite, a store of its own per case on a fake
// clock.
func TestBatchConformance(t *testing.T) {
	storetest.RunBatch(t, perCase(client, testTable, true), batchFeatures(t))
}

// The batch cases on moto, which returns the old item with a failed
// condition as DynamoDB does (skipped where moto_server is missing).
func TestBatchConformanceMoto(t *testing.T) {
	m, err := testserver.StartMoto()
	if errors.Is(err, testserver.ErrMotoMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	motoClient := newClient(m.Endpoint, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dynamo.CreateTable(ctx, motoClient, dynamo.TableConfig{Table: testTable}); err != nil {
		t.Fatalf("CreateTable on moto: %v", err)
	}
	storetest.RunBatch(t, perCase(motoClient, testTable, true), batchFeatures(t))
}
