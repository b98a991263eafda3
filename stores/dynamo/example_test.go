package dynamo_test

import (
	"context"
	"log"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/watermill-dedup/watermill-dedup/dedup"
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
	store, err := dynamo.New(dynamo.Config{
		Client: dynamodb.NewFromConfig(awsConfig),
		Table:  "dedup",
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
