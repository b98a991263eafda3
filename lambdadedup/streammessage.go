package lambdadedup

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"
)

// KinesisMessage converts a Kinesis record into the message a key function
// and the handler get: Payload is the record's data (decoded from base64,
// as aws-lambda-go delivers it), UUID its sequence number (a transport id,
// refused as a key), no metadata. A Watermill publisher that puts the same
// payload on a topic gives a router the same key.
func KinesisMessage(record events.KinesisEventRecord) *message.Message {
	return message.NewMessage(record.Kinesis.SequenceNumber, record.Kinesis.Data)
}

// DynamoDBMessage converts a DynamoDB stream record: Payload is the item as
// a JSON object (NewImage, or Keys when there is no new image, as for
// REMOVE or a KEYS_ONLY stream), UUID the event id (a transport id), no
// metadata. Attribute values become plain JSON: S a string, N a number (its
// decimal text, unchanged), BOOL, NULL, M an object, L an array, SS and NS
// arrays of strings and numbers, B a base64 string, BS an array of them.
// Object keys are sorted, so a fingerprint of the payload is stable. It
// fails on a number that is not valid JSON or a record with neither image
// nor keys.
func DynamoDBMessage(record events.DynamoDBEventRecord) (*message.Message, error) {
	item := record.Change.NewImage
	if len(item) == 0 {
		item = record.Change.Keys
	}
	if len(item) == 0 {
		return nil, fmt.Errorf("lambdadedup: DynamoDB stream record %s has neither NewImage nor Keys", record.EventID)
	}
	payload, err := json.Marshal(attributeMap(item))
	if err != nil {
		return nil, fmt.Errorf("lambdadedup: DynamoDB stream record %s: %w", record.EventID, err)
	}
	return message.NewMessage(record.EventID, payload), nil
}

func attributeMap(m map[string]events.DynamoDBAttributeValue) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = attributeValue(v)
	}
	return out
}

func attributeValue(v events.DynamoDBAttributeValue) any {
	switch v.DataType() {
	case events.DataTypeString:
		return v.String()
	case events.DataTypeNumber:
		return json.Number(v.Number())
	case events.DataTypeBoolean:
		return v.Boolean()
	case events.DataTypeNull:
		return nil
	case events.DataTypeMap:
		return attributeMap(v.Map())
	case events.DataTypeList:
		l := v.List()
		out := make([]any, len(l))
		for i, e := range l {
			out[i] = attributeValue(e)
		}
		return out
	case events.DataTypeStringSet:
		return v.StringSet()
	case events.DataTypeNumberSet:
		ns := v.NumberSet()
		out := make([]json.Number, len(ns))
		for i, n := range ns {
			out[i] = json.Number(n)
		}
		return out
	case events.DataTypeBinary:
		return base64.StdEncoding.EncodeToString(v.Binary())
	case events.DataTypeBinarySet:
		bs := v.BinarySet()
		out := make([]string, len(bs))
		for i, b := range bs {
			out[i] = base64.StdEncoding.EncodeToString(b)
		}
		return out
	}
	return nil
}

type (
	kinesisKey     struct{}
	dynamoDBKey    struct{}
	eventBridgeKey struct{}
)

// KinesisRecordFromContext returns the Kinesis record a handler was called
// for (by HandleKinesis).
func KinesisRecordFromContext(ctx context.Context) (events.KinesisEventRecord, bool) {
	r, ok := ctx.Value(kinesisKey{}).(*events.KinesisEventRecord)
	if !ok {
		return events.KinesisEventRecord{}, false
	}
	return *r, true
}

// DynamoDBRecordFromContext returns the DynamoDB stream record a handler
// was called for (by HandleDynamoDB).
func DynamoDBRecordFromContext(ctx context.Context) (events.DynamoDBEventRecord, bool) {
	r, ok := ctx.Value(dynamoDBKey{}).(*events.DynamoDBEventRecord)
	if !ok {
		return events.DynamoDBEventRecord{}, false
	}
	return *r, true
}

// EventBridgeEventFromContext returns the EventBridge event a handler was
// called for (by HandleEventBridge).
func EventBridgeEventFromContext(ctx context.Context) (events.EventBridgeEvent, bool) {
	e, ok := ctx.Value(eventBridgeKey{}).(*events.EventBridgeEvent)
	if !ok {
		return events.EventBridgeEvent{}, false
	}
	return *e, true
}

// EventBridgeMessage converts an EventBridge event: Payload is its detail
// (the JSON object, byte for byte), UUID its id (a transport id, refused as
// a key), no metadata.
func EventBridgeMessage(event events.EventBridgeEvent) *message.Message {
	return message.NewMessage(event.ID, []byte(event.Detail))
}
