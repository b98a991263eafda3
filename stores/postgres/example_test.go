package postgres_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// A handler whose business write (the order row) and the completion of its
// dedup key commit in one transaction.
func ExampleStore_TxMiddleware() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	store, err := postgres.New(ctx, postgres.Config{DB: pool})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	deduplicator, err := dedup.New(dedup.Config{
		Store: store,
		Key: func(msg *message.Message) (string, error) {
			return msg.Metadata.Get("order_id"), nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}

	router, err := message.NewRouter(message.RouterConfig{}, watermill.NewStdLogger(false, false))
	if err != nil {
		log.Fatal(err)
	}
	// The first middleware added is the outermost: dedup claims the key,
	// then TxMiddleware begins the transaction the handler writes through.
	router.AddMiddleware(deduplicator.Middleware, store.TxMiddleware)

	var subscriber message.Subscriber // your broker's subscriber
	router.AddConsumerHandler("charge", "orders", subscriber, func(msg *message.Message) error {
		tx, _ := postgres.TxFromContext(msg.Context())
		_, err := tx.Exec(msg.Context(), "INSERT INTO orders (order_id, amount) VALUES ($1, $2)",
			msg.Metadata.Get("order_id"), 150)
		return err // nil: the row and the key's completion commit together
	})
	_ = router.Run(ctx)
}

// The sweep: delete expired records in bounded batches, every minute, until
// ctx is cancelled. Correctness never depends on it; it bounds the table.
func ExampleStore_DeleteExpired() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	store, err := postgres.New(ctx, postgres.Config{DB: pool})
	if err != nil {
		log.Fatal(err)
	}
	ticker := time.NewTicker(time.Minute)
	defer ticker.Stop()
	for {
		for { // a batch of at most 1000 rows per statement keeps each transaction short
			n, err := store.DeleteExpired(ctx, 1000)
			if err != nil {
				log.Print(err)
				break
			}
			if n < 1000 {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// One record in PostgreSQL: claimed, completed with its result, a
// duplicate, and refused as a conflict for another payload's fingerprint.
// The example works in a schema of its own, dropped at its end; in
// production postgres.Config{} keeps the records in public.dedup_keys.
func ExampleNew() {
	ctx := context.Background()
	db := pool // the test's; pgxpool.New(ctx, os.Getenv("DATABASE_URL")) in production
	schema := "dedup_example_" + randomHex(4)
	if _, err := db.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}
	defer func() { _, _ = db.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE") }()

	store, err := postgres.New(ctx, postgres.Config{DB: db, Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil { // CREATE TABLE IF NOT EXISTS, safe to run at every start
		log.Fatal(err)
	}
	key := admin.ScopedKey("charge-orders", "ORDER-003")
	res, err := store.Claim(ctx, key, "fp-a", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Outcome)
	if err := store.Complete(ctx, res.Claim, []byte("receipt-7"), 24*time.Hour); err != nil {
		log.Fatal(err)
	}
	for _, fp := range []string{"fp-a", "fp-b"} {
		res, err := store.Claim(ctx, key, fp, 30*time.Second)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s %q\n", res.Outcome, res.Result)
	}
	// Output:
	// acquired
	// duplicate "receipt-7"
	// conflict ""
}
