package txcrash

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// A Lambda SQS handler (lambdadedup) calls the store's RunInTx with the
// message's context, which carries the claim: the charge is written with
// the record in one TransactWriteItems. Two copies of one order in a
// batch, and the whole batch delivered again, charge each order once.
func TestLambdaRunInTxMoto(t *testing.T) {
	if childMain(t, newDynamoConsumer(t)) {
		return
	}
	b := motoBackend(t) // the test's tables
	c, err := newDynamoConsumer(t)(motoEndpoint, true)
	if err != nil {
		t.Fatal(err)
	}
	dc := c.(*dynamoConsumer)
	h, err := lambdadedup.New(lambdadedup.Config{Dedup: dedup.Config{Scope: scope, Store: dc.store, Key: keyfuncs.JSON("order_id"), Lease: lease}},
		func(msg *message.Message) error {
			order, err := keyfuncs.JSON("order_id")(msg)
			if err != nil {
				return err
			}
			_, err = dc.store.RunInTx(msg.Context(), func(ctx context.Context) ([]byte, error) {
				tx, ok := dynamo.TxFromContext(ctx)
				if !ok {
					return nil, fmt.Errorf("no transaction in the handler's context")
				}
				return nil, tx.Add(types.TransactWriteItem{Update: dc.charge(order)})
			})
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	var records []events.SQSMessage
	for i, o := range []int{0, 1, 0, 2} {
		records = append(records, events.SQSMessage{MessageId: fmt.Sprintf("m%d", i), Body: `{"order_id":"` + keyName(o) + `"}`,
			EventSource: "aws:sqs", EventSourceARN: "arn:aws:sqs:us-east-1:000000000000:orders"})
	}
	payload, err := json.Marshal(events.SQSEvent{Records: records})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		out, err := lambda.NewHandler(h.Handle).Invoke(context.Background(), payload)
		if err != nil {
			t.Fatalf("Invoke: %v", err)
		}
		var resp events.SQSEventResponse
		if err := json.Unmarshal(out, &resp); err != nil || len(resp.BatchItemFailures) != 0 {
			t.Fatalf("response %s, %v; want no failures", out, err)
		}
	}
	effects := b.effects(t)
	for i := range 3 {
		if effects[i] != 1 {
			t.Fatalf("%s charged %d times; want once", keyName(i), effects[i])
		}
	}
}
