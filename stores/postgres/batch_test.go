package postgres_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storetest"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// countingDB is the package's pool, counting the requests (round trips)
// sent through it: a pgx.Batch is one.
type countingDB struct{ n atomic.Int64 }

func (d *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	d.n.Add(1)
	return pool.Exec(ctx, sql, args...)
}

func (d *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	d.n.Add(1)
	return pool.QueryRow(ctx, sql, args...)
}

func (d *countingDB) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	return pool.BeginTx(ctx, opts)
}

func (d *countingDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	d.n.Add(1)
	return pool.SendBatch(ctx, b)
}

// countingStore is a store whose requests are counted
// (storetest.RequestCounter).
type countingStore struct {
	*postgres.Store
	db *countingDB
}

func (s countingStore) Requests() int64 { return s.db.n.Load() }

func batchFeatures() storetest.Features {
	f := features
	f.Batch, f.BatchRequestSize = true, postgres.BatchRequestSize
	return f
}

// The batch cases, every case on a store of its own in one schema,
// counting requests: a batch of new keys is one round trip.
func TestBatchConformance(t *testing.T) {
	schema := newSchema(t)
	newStore(t, postgres.Config{Schema: schema}) // migrated once
	f := batchFeatures()
	f.OneRequestBatch = true
	storetest.RunBatch(t, func(t *testing.T) (dedup.Store, func(time.Duration)) {
		db := &countingDB{}
		s, err := postgres.New(context.Background(), postgres.Config{DB: db, Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		return countingStore{Store: s, db: db}, nil
	}, f)
}
