package lambdadedup_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// ORDER-003 three times in one batch (three MessageIds), and a record
// without an order id: one charge, and only the bad record to retry.
func ExampleHandler_Handle() {
	store, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		panic(err)
	}
	h, err := lambdadedup.New(lambdadedup.Config{
		Dedup: dedup.Config{Store: store, Key: keyfuncs.JSON("order_id"), Scope: "charge-orders"},
	}, func(msg *message.Message) error {
		fmt.Printf("charged %s\n", msg.Payload)
		return nil
	})
	if err != nil {
		panic(err)
	}
	body := `{"order_id":"ORDER-003","amount":150}`
	resp, _ := h.Handle(context.Background(), events.SQSEvent{Records: []events.SQSMessage{
		{MessageId: "m1", Body: body}, {MessageId: "m2", Body: body}, {MessageId: "m3", Body: body},
		{MessageId: "m4", Body: `{"amount":1}`},
	}})
	fmt.Println("batch item failures:", resp.BatchItemFailures)
	// Output:
	// charged {"order_id":"ORDER-003","amount":150}
	// batch item failures: [{m4}]
}
