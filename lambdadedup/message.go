package lambdadedup

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"
)

// UUIDAttribute is the message attribute in which watermill-aws's SQS
// publisher sends the Watermill message UUID (its sqs.UUIDAttribute).
const UUIDAttribute = "_watermill_message_uuid"

// Message converts an SQS record the way watermill-aws's SQS subscriber
// (v1.0.1, DefaultMarshalerUnmarshaler) converts a received message, so
// that a key function (dedup.Config.Key) takes the same key from it in both runtimes:
//
//   - Payload is the body, byte for byte;
//   - Metadata holds the message attributes of data type "String" and
//     "Number" (their string value) and "Binary" (its bytes as a string);
//     attributes of other data types, such as "String.custom", are left
//     out, as watermill-aws leaves them out;
//   - UUID is the UUIDAttribute attribute when the message was published
//     by Watermill (the attribute is then not in Metadata), else the SQS
//     MessageId.
//
// System attributes (MessageGroupId, ApproximateReceiveCount, ...) are not
// metadata, as in watermill-aws; read them from RecordFromContext.
func Message(record events.SQSMessage) *message.Message {
	meta := make(message.Metadata, len(record.MessageAttributes))
	for k, v := range record.MessageAttributes {
		switch v.DataType {
		case "String", "Number":
			if v.StringValue != nil {
				meta[k] = *v.StringValue
			}
		case "Binary":
			meta[k] = string(v.BinaryValue)
		}
	}
	delete(meta, UUIDAttribute)
	msg := message.NewMessage(messageUUID(&record), []byte(record.Body))
	msg.Metadata = meta
	return msg
}

// messageUUID is the UUID Message gives the record's message: the
// UUIDAttribute attribute, else the SQS MessageId.
func messageUUID(record *events.SQSMessage) string {
	if v, ok := record.MessageAttributes[UUIDAttribute]; ok && v.StringValue != nil {
		return *v.StringValue
	}
	return record.MessageId
}

type recordKey struct{}

// RecordFromContext returns the SQS record a handler was called for: the
// message's context carries it.
func RecordFromContext(ctx context.Context) (events.SQSMessage, bool) {
	r, ok := ctx.Value(recordKey{}).(*events.SQSMessage)
	if !ok {
		return events.SQSMessage{}, false
	}
	return *r, true
}
