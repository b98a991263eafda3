package postgres_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// Plain Go work under the engine, with its row and its completed key in one
// transaction: the second call of the same key is a duplicate, the row is
// written once. (pool is a *pgxpool.Pool; the example runs in a schema of
// its own.)
func ExampleStore_RunInTx() {
	ctx := context.Background()
	schema := "dedup_example_" + randomHex(4)
	_, _ = pool.Exec(ctx, "CREATE SCHEMA "+schema)
	defer func() { _, _ = pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE") }()
	refunds := pgx.Identifier{schema, "refunds"}.Sanitize()
	_, _ = pool.Exec(ctx, "CREATE TABLE "+refunds+" (refund_id text NOT NULL)")

	store, err := postgres.New(ctx, postgres.Config{DB: pool, Schema: schema})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	engine, err := dedup.NewEngine(dedup.Config{Store: store})
	if err != nil {
		panic(err)
	}
	refund := func(ctx context.Context) ([]byte, error) {
		return store.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
			tx, _ := postgres.TxFromContext(ctx)
			if _, err := tx.Exec(ctx, "INSERT INTO "+refunds+" (refund_id) VALUES ('R-1')"); err != nil {
				return nil, err
			}
			return []byte("refunded R-1"), nil // stored with the completed key
		})
	}
	for range 2 {
		res, err := engine.Do(ctx, dedup.Call{Scope: "refunds", Key: "R-1"}, refund)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: %s\n", res.Outcome, res.Result)
	}
	var rows int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+refunds).Scan(&rows)
	fmt.Println("rows:", rows)
	// Output:
	// acquired: refunded R-1
	// duplicate: refunded R-1
	// rows: 1
}
