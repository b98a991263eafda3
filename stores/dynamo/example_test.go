package dynamo_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// A store on an existing table (see CreateTable or the README's
// CloudFormation snippet), used by the middleware.
func ExampleNew() {
	ctx := context.Background()
	awsConfig, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	store, err := dynamo.New(ctx, dynamo.Config{
		Client: dynamodb.NewFromConfig(awsConfig),
		Table:  "dedup", // checked: exists, key schema, TTL on
	})
	if err != nil {
		log.Fatal(err)
	}
	d, err := dedup.New(dedup.Config{
		Store: store,
		Key: func(msg *message.Message) (string, error) {
			if id := msg.Metadata.Get("order_id"); id != "" {
				return id, nil
			}
			return "", dedup.ErrNoKey
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = d.Middleware // router.AddMiddleware(d.Middleware)
}

// One record on dynalite (the tests' DynamoDB emulator): claimed, completed
// with its result, a duplicate, and refused as a conflict when the key
// comes back with another payload's fingerprint. Every outcome is decided
// by one conditional PutItem (plus one GetItem on servers that do not
// return the old item, as dynalite).
func ExampleStore_Claim() {
	ctx := context.Background()
	store, err := dynamo.New(ctx, dynamo.Config{
		Client:  client, // the test's: dynamodb.NewFromConfig(awsConfig) in production
		Table:   testTable,
		SkipTTL: true, // dynalite has no Time to Live
	})
	if err != nil {
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
	fmt.Println("largest result:", store.MaxResultSize(), "bytes")
	if _, err := store.Evict(ctx, key); err != nil { // an operator's delete: leaves nothing behind
		log.Fatal(err)
	}
	// Output:
	// acquired
	// duplicate "receipt-7"
	// conflict ""
	// largest result: 408472 bytes
}
