package esm_test

import (
	"encoding/json"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/watermill-dedup/watermill-dedup/examples/lambda/esm"
)

// A received SQS message becomes the record Lambda puts in its SQSEvent:
// what the mapping hands the function for each message of a batch.
func ExampleRecord() {
	msg := types.Message{
		MessageId:     aws.String("059f36b4-87a3-44ab-83d2-661975830a7d"),
		ReceiptHandle: aws.String("AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a"),
		Body:          aws.String(`{"order_id":"ORDER-003","amount":150}`),
		Attributes:    map[string]string{"ApproximateReceiveCount": "1"},
		MessageAttributes: map[string]types.MessageAttributeValue{
			"tenant": {DataType: aws.String("String"), StringValue: aws.String("acme")},
		},
	}
	record := esm.Record(msg, "arn:aws:sqs:us-east-1:000000000000:orders", "us-east-1")
	out, err := json.MarshalIndent(record, "", "  ")
	if err != nil {
		panic(err)
	}
	fmt.Println(string(out))
	// Output:
	// {
	//   "messageId": "059f36b4-87a3-44ab-83d2-661975830a7d",
	//   "receiptHandle": "AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a",
	//   "body": "{\"order_id\":\"ORDER-003\",\"amount\":150}",
	//   "md5OfBody": "",
	//   "md5OfMessageAttributes": "",
	//   "attributes": {
	//     "ApproximateReceiveCount": "1"
	//   },
	//   "messageAttributes": {
	//     "tenant": {
	//       "stringValue": "acme",
	//       "stringListValues": null,
	//       "binaryListValues": null,
	//       "dataType": "String"
	//     }
	//   },
	//   "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:orders",
	//   "eventSource": "aws:sqs",
	//   "awsRegion": "us-east-1"
	// }
}
