package lambdadedup_test

import (
	"maps"
	"testing"

	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
)

// Message gives a key function what watermill-aws's SQS subscriber gives
// it for the same message: payload, metadata and UUID.
func TestMessageMatchesWatermillAWS(t *testing.T) {
	attrs := map[string]struct {
		dataType string
		str      *string
		bin      []byte
	}{
		"order_id":                {"String", aws.String("ORDER-003"), nil},
		"amount":                  {"Number", aws.String("150"), nil},
		"blob":                    {"Binary", nil, []byte("raw\x00bytes")},
		"custom":                  {"String.custom", aws.String("left out"), nil},
		"empty":                   {"String", aws.String(""), nil},
		lambdadedup.UUIDAttribute: {"String", aws.String("01J-watermill-uuid"), nil},
	}
	for _, withUUID := range []bool{true, false} {
		sqsMsg := types.Message{MessageId: aws.String("sqs-id-1"), Body: aws.String(`{"order_id":"ORDER-003"}`), MessageAttributes: map[string]types.MessageAttributeValue{}}
		rec := events.SQSMessage{MessageId: "sqs-id-1", Body: `{"order_id":"ORDER-003"}`, MessageAttributes: map[string]events.SQSMessageAttribute{}}
		for k, a := range attrs {
			if k == lambdadedup.UUIDAttribute && !withUUID {
				continue
			}
			sqsMsg.MessageAttributes[k] = types.MessageAttributeValue{DataType: aws.String(a.dataType), StringValue: a.str, BinaryValue: a.bin}
			rec.MessageAttributes[k] = events.SQSMessageAttribute{DataType: a.dataType, StringValue: a.str, BinaryValue: a.bin}
		}
		want, err := wsqs.DefaultMarshalerUnmarshaler{}.Unmarshal(&sqsMsg)
		if err != nil {
			t.Fatal(err)
		}
		got := lambdadedup.Message(rec)
		if got.UUID != want.UUID || string(got.Payload) != string(want.Payload) || !maps.Equal(got.Metadata, want.Metadata) {
			t.Errorf("with uuid attribute %v:\n got  %q %q %v\n want %q %q %v", withUUID, got.UUID, got.Payload, got.Metadata, want.UUID, want.Payload, want.Metadata)
		}
	}
}
