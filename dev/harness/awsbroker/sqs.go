package awsbroker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/watermill-dedup/watermill-dedup/cmd/dedupctl/env/awsenv"
)

// Metadata added to every message received through SQSSubscriber or
// SNSSubscriber. SQSMessageID is the transport id: a new one for every
// SendMessage and every SNS delivery, so never a deduplication key. The
// marshalers of this package drop these entries, so a republished message
// (poison queue, forwarding) does not carry them along.
const (
	MetaSQSMessageID     = "sqs_message_id"
	MetaSQSReceiptHandle = "sqs_receipt_handle"
	MetaSQSQueueURL      = "sqs_queue_url"
)

var sqsMeta = []string{MetaSQSMessageID, MetaSQSReceiptHandle, MetaSQSQueueURL}

// QueueOptions describes a queue and how it is read.
type QueueOptions struct {
	// VisibilityTimeout is how long a received message stays hidden before
	// SQS delivers it again if it is not deleted (acked). Defaults to 30s,
	// SQS's default; whole seconds.
	VisibilityTimeout time.Duration
	// MaxMessages is how many messages one ReceiveMessage fetches (1..10).
	// watermill-aws hands them to the router one at a time and stops the
	// batch at the first nack, leaving the rest hidden until their
	// visibility timeout ends. Defaults to 1.
	MaxMessages int32
	// WaitTime is the long-poll wait of ReceiveMessage. Defaults to 20s
	// (the maximum): an idle consumer costs one request per 20s.
	WaitTime time.Duration
}

func (o *QueueOptions) setDefaults() {
	if o.VisibilityTimeout == 0 {
		o.VisibilityTimeout = 30 * time.Second
	}
	if o.MaxMessages == 0 {
		o.MaxMessages = 1
	}
	if o.WaitTime == 0 {
		o.WaitTime = 20 * time.Second
	}
}

func seconds(d time.Duration) string { return strconv.Itoa(int((d + time.Second - 1) / time.Second)) }

// CreateQueue creates a standard queue (or returns the existing one with
// the same attributes) and returns its URL.
func (b *Broker) CreateQueue(ctx context.Context, name string, opts QueueOptions) (string, error) {
	opts.setDefaults()
	out, err := b.SQS().CreateQueue(ctx, &sqs.CreateQueueInput{
		QueueName:  aws.String(name),
		Attributes: map[string]string{"VisibilityTimeout": seconds(opts.VisibilityTimeout)},
	})
	if err != nil {
		return "", fmt.Errorf("awsbroker: creating SQS queue %q: %w", name, err)
	}
	return aws.ToString(out.QueueUrl), nil
}

// DeleteQueue deletes the queue at url.
func (b *Broker) DeleteQueue(ctx context.Context, url string) error {
	_, err := b.SQS().DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	return err
}

// DeleteQueueNamed deletes the queue called name, if it exists.
func (b *Broker) DeleteQueueNamed(ctx context.Context, name string) error {
	out, err := b.SQS().GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
	var missing *types.QueueDoesNotExist
	if errors.As(err, &missing) {
		return nil
	}
	if err != nil {
		return err
	}
	return b.DeleteQueue(ctx, aws.ToString(out.QueueUrl))
}

// QueueDepth returns how many messages the queue at url still holds:
// visible (waiting), not visible (received and neither deleted nor timed
// out: in flight) and delayed. On AWS the counts are approximate and lag by
// up to a minute; emulators answer exactly.
func (b *Broker) QueueDepth(ctx context.Context, url string) (visible, inFlight, delayed int, err error) {
	out, err := b.SQS().GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url),
		AttributeNames: []types.QueueAttributeName{
			types.QueueAttributeNameApproximateNumberOfMessages,
			types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
			types.QueueAttributeNameApproximateNumberOfMessagesDelayed,
		},
	})
	if err != nil {
		return 0, 0, 0, err
	}
	n := func(name types.QueueAttributeName) (int, error) {
		v, ok := out.Attributes[string(name)]
		if !ok {
			return 0, fmt.Errorf("awsbroker: GetQueueAttributes did not return %s", name)
		}
		return strconv.Atoi(v)
	}
	var errs [3]error
	visible, errs[0] = n(types.QueueAttributeNameApproximateNumberOfMessages)
	inFlight, errs[1] = n(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)
	delayed, errs[2] = n(types.QueueAttributeNameApproximateNumberOfMessagesDelayed)
	return visible, inFlight, delayed, errors.Join(errs[:]...)
}

// SQSMarshaler is watermill-aws's default SQS marshaler, minus the
// receive-side metadata this package adds (MetaSQS*).
type SQSMarshaler struct{}

// Marshal implements wsqs.Marshaler.
func (SQSMarshaler) Marshal(msg *message.Message) (*types.Message, error) {
	return wsqs.DefaultMarshalerUnmarshaler{}.Marshal(withoutSQSMeta(msg))
}

func withoutSQSMeta(msg *message.Message) *message.Message {
	strip := false
	for _, k := range sqsMeta {
		if _, ok := msg.Metadata[k]; ok {
			strip = true
		}
	}
	if !strip {
		return msg
	}
	c := message.NewMessage(msg.UUID, msg.Payload)
	for k, v := range msg.Metadata {
		c.Metadata[k] = v
	}
	for _, k := range sqsMeta {
		delete(c.Metadata, k)
	}
	return c
}

// sqsUnmarshaler is the default unmarshaler plus the MetaSQS* entries.
type sqsUnmarshaler struct{ queueURL string }

func (u sqsUnmarshaler) Unmarshal(m *types.Message) (*message.Message, error) {
	msg, err := wsqs.DefaultMarshalerUnmarshaler{}.Unmarshal(m)
	if err != nil {
		return nil, err
	}
	msg.Metadata.Set(MetaSQSMessageID, aws.ToString(m.MessageId))
	msg.Metadata.Set(MetaSQSReceiptHandle, aws.ToString(m.ReceiptHandle))
	msg.Metadata.Set(MetaSQSQueueURL, u.queueURL)
	return msg, nil
}

// SQSPublisher returns a watermill-aws SQS publisher; the topic passed to
// Publish is the queue name (created when missing).
func (b *Broker) SQSPublisher(logger watermill.LoggerAdapter) (*wsqs.Publisher, error) {
	return wsqs.NewPublisher(wsqs.PublisherConfig{AWSConfig: b.AWS.Config, Marshaler: SQSMarshaler{}}, logger)
}

// sqsSubscriberConfig is the watermill-aws configuration of a subscriber
// reading the queue at url.
func (b *Broker) sqsSubscriberConfig(url string, opts QueueOptions) wsqs.SubscriberConfig {
	opts.setDefaults()
	return wsqs.SubscriberConfig{
		AWSConfig:             b.AWS.Config,
		QueueConfigAttributes: wsqs.QueueConfigAttributes{VisibilityTimeout: seconds(opts.VisibilityTimeout)},
		GenerateReceiveMessageInput: func(ctx context.Context, queueURL wsqs.QueueURL) (*sqs.ReceiveMessageInput, error) {
			return &sqs.ReceiveMessageInput{
				QueueUrl:                    aws.String(string(queueURL)),
				MessageAttributeNames:       []string{"All"},
				MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount},
				WaitTimeSeconds:             int32(opts.WaitTime / time.Second),
				MaxNumberOfMessages:         opts.MaxMessages,
			}, nil
		},
		Unmarshaler: sqsUnmarshaler{queueURL: url},
	}
}

// SQSSubscriber creates the queue name (see CreateQueue) and returns a
// watermill-aws subscriber for it; Subscribe takes the queue name as its
// topic. Every Subscribe call starts one more receiver: watermill-aws hands
// a receiver's messages to the router one at a time, so N Subscribe calls
// (N router handlers) process up to N messages at once.
func (b *Broker) SQSSubscriber(ctx context.Context, queue string, opts QueueOptions, logger watermill.LoggerAdapter) (sub *wsqs.Subscriber, url string, err error) {
	url, err = b.CreateQueue(ctx, queue, opts)
	if err != nil {
		return nil, "", err
	}
	sub, err = wsqs.NewSubscriber(b.sqsSubscriberConfig(url, opts), logger)
	if err != nil {
		return nil, "", err
	}
	return sub, url, nil
}

// RetryAfter returns a router middleware for handlers fed by SQSSubscriber
// or SNSSubscriber: when the handler fails (the message is nacked), it sets
// the message's visibility timeout to delay, so SQS delivers it again after
// delay instead of after the queue's whole visibility timeout
// (watermill-aws v1.0.1 leaves a nacked message hidden until then). A
// delay of zero redelivers at once. Messages without the SQS metadata pass
// through unchanged; a failed ChangeMessageVisibility call only means the
// full timeout applies. Cost: one request per nack.
func (b *Broker) RetryAfter(delay time.Duration) message.HandlerMiddleware {
	client := b.SQS()
	secs := int32(delay / time.Second)
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil {
				return out, nil
			}
			url, receipt := msg.Metadata.Get(MetaSQSQueueURL), msg.Metadata.Get(MetaSQSReceiptHandle)
			if url != "" && receipt != "" {
				ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), awsenv.PingTimeout)
				_, _ = client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
					QueueUrl: aws.String(url), ReceiptHandle: aws.String(receipt), VisibilityTimeout: secs,
				})
				cancel()
			}
			return out, err
		}
	}
}
