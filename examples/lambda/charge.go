package main

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"

	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
)

// newCharger returns the "charge order" handler. It has a Watermill
// router's consumer-handler signature, so the same function runs under
// router.AddConsumerHandler with dedup.New(...).Middleware.
func newCharger(out io.Writer, charges *atomic.Int64) func(msg *message.Message) error {
	return func(msg *message.Message) error {
		id, err := keyfuncs.JSON("order_id")(msg)
		if err != nil {
			return err
		}
		// The payment gateway call goes here, with msg.Context(): it is
		// cancelled when the claim is lost or the invocation ends.
		if err := msg.Context().Err(); err != nil {
			return err
		}
		n := charges.Add(1)
		fmt.Fprintf(out, "charged %s (charge #%d, message %s)\n", id, n, msg.UUID)
		return nil
	}
}

// plainHandler is the same handler without lambdadedup: every record is
// charged.
func plainHandler(charge func(*message.Message) error) func(context.Context, events.SQSEvent) (events.SQSEventResponse, error) {
	return func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
		var resp events.SQSEventResponse
		for _, r := range ev.Records {
			msg := lambdadedup.Message(r)
			msg.SetContext(ctx)
			if err := charge(msg); err != nil {
				resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: r.MessageId})
			}
		}
		return resp, nil
	}
}
