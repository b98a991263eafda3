package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsns "github.com/ThreeDotsLabs/watermill-aws/sns"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// The wiring of this example: the AWS SDK's standard configuration, and the
// three adapters watermill-aws v1.0.1 needs here (SNS publish with
// TopicArn, the SQS MessageId and receipt handle in the metadata, a short
// redelivery delay after a nack).

// fauxqsHint is printed when SQS or SNS does not answer.
const fauxqsHint = "start the local SQS/SNS emulator with `npm ci --prefix tools && node examples/sqs/fauxqs.mjs` (fauxqs on 127.0.0.1:4566) " +
	"and set AWS_ENDPOINT_URL=http://127.0.0.1:4566 (or set AWS_REGION and credentials to use AWS)"

// dynaliteHint is printed when DynamoDB does not answer.
const dynaliteHint = "start the local DynamoDB emulator with `npm ci --prefix tools && node tools/node_modules/dynalite/cli.js --host 127.0.0.1 --port 4567` " +
	"and set AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:4567 (or set AWS_REGION and credentials to use AWS)"

// hintError is an error with a line that says how to fix it.
type hintError struct {
	err  error
	hint string
}

func (e *hintError) Error() string { return e.err.Error() }
func (e *hintError) Unwrap() error { return e.err }

// loadAWS loads the SDK configuration from the standard environment. When
// every endpoint of services points at this machine (an emulator), the
// region defaults to us-east-1 and, without AWS_ACCESS_KEY_ID, the
// credentials to test/test.
func loadAWS(ctx context.Context, services ...string) (aws.Config, error) {
	var opts []func(*awsconfig.LoadOptions) error
	if allLoopback(services) {
		if os.Getenv("AWS_REGION") == "" && os.Getenv("AWS_DEFAULT_REGION") == "" {
			opts = append(opts, awsconfig.WithRegion("us-east-1"))
		}
		if os.Getenv("AWS_ACCESS_KEY_ID") == "" {
			opts = append(opts, awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("test", "test", "")))
		}
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err == nil && cfg.Region == "" {
		err = errors.New("no AWS region: set AWS_REGION to use AWS, or AWS_ENDPOINT_URL to use a local emulator")
	}
	return cfg, err
}

// endpoint returns AWS_ENDPOINT_URL_<SERVICE>, else AWS_ENDPOINT_URL.
func endpoint(service string) string {
	if v := os.Getenv("AWS_ENDPOINT_URL_" + strings.ToUpper(service)); v != "" {
		return v
	}
	return os.Getenv("AWS_ENDPOINT_URL")
}

func allLoopback(services []string) bool {
	for _, s := range services {
		u, err := url.Parse(endpoint(s))
		if err != nil || u.Host == "" {
			return false
		}
		if ip := net.ParseIP(u.Hostname()); u.Hostname() != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return false
		}
	}
	return len(services) > 0
}

// where names the endpoint of service for the output.
func where(cfg aws.Config, service string) string {
	if e := endpoint(service); e != "" {
		return e
	}
	return "AWS " + cfg.Region
}

// pingSQS checks that SQS answers (one ListQueues call, not retried).
func pingSQS(ctx context.Context, cfg aws.Config) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := sqs.NewFromConfig(cfg).ListQueues(ctx, &sqs.ListQueuesInput{MaxResults: aws.Int32(1)}, func(o *sqs.Options) { o.RetryMaxAttempts = 1 })
	if err != nil {
		return &hintError{fmt.Errorf("sqs does not answer at %s: %w", where(cfg, "sqs"), err), fauxqsHint}
	}
	return nil
}

// Metadata the subscriber adds to every received message. The MessageId is
// the transport id: a new one for every SendMessage and every SNS delivery,
// so never a deduplication key.
const (
	metaMessageID     = "sqs_message_id"
	metaReceiptHandle = "sqs_receipt_handle"
	metaQueueURL      = "sqs_queue_url"
)

// withSQSMetadata is watermill-aws's default unmarshaler plus the metadata
// above.
type withSQSMetadata struct{ queueURL string }

func (u withSQSMetadata) Unmarshal(m *types.Message) (*message.Message, error) {
	msg, err := wsqs.DefaultMarshalerUnmarshaler{}.Unmarshal(m)
	if err != nil {
		return nil, err
	}
	msg.Metadata.Set(metaMessageID, aws.ToString(m.MessageId))
	msg.Metadata.Set(metaReceiptHandle, aws.ToString(m.ReceiptHandle))
	msg.Metadata.Set(metaQueueURL, u.queueURL)
	return msg, nil
}

// topicArnMarshaler publishes with TopicArn instead of TargetArn: both are
// valid on AWS, local emulators such as fauxqs accept only TopicArn.
type topicArnMarshaler struct{}

func (topicArnMarshaler) Marshal(topicArn wsns.TopicArn, msg *message.Message) *sns.PublishInput {
	in := wsns.DefaultMarshalerUnmarshaler{}.Marshal(topicArn, msg)
	in.TopicArn, in.TargetArn = in.TargetArn, nil
	return in
}

// retryAfter makes a nacked message visible again after delay, instead of
// after the queue's whole visibility timeout (watermill-aws v1.0.1 leaves it
// hidden until then). Cost: one ChangeMessageVisibility call per nack; if
// it fails, the full timeout applies.
func retryAfter(client *sqs.Client, delay time.Duration) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil || msg.Metadata.Get(metaReceiptHandle) == "" {
				return out, err
			}
			ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), 5*time.Second)
			defer cancel()
			_, _ = client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
				QueueUrl:          aws.String(msg.Metadata.Get(metaQueueURL)),
				ReceiptHandle:     aws.String(msg.Metadata.Get(metaReceiptHandle)),
				VisibilityTimeout: int32(delay / time.Second),
			})
			return out, err
		}
	}
}

// createQueue creates a standard queue (or finds it) and returns its URL.
func createQueue(ctx context.Context, client *sqs.Client, name string, visibility time.Duration) (string, error) {
	out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{
		QueueName:  aws.String(name),
		Attributes: map[string]string{"VisibilityTimeout": strconv.Itoa(int(visibility / time.Second))},
	})
	if err != nil {
		return "", fmt.Errorf("creating SQS queue %q: %w", name, err)
	}
	return aws.ToString(out.QueueUrl), nil
}

// subscriberConfig reads the queue at queueURL one message per receive,
// long-polling up to 20s, with the SQS metadata.
func subscriberConfig(cfg aws.Config, queueURL string, visibility time.Duration) wsqs.SubscriberConfig {
	return wsqs.SubscriberConfig{
		AWSConfig:             cfg,
		QueueConfigAttributes: wsqs.QueueConfigAttributes{VisibilityTimeout: strconv.Itoa(int(visibility / time.Second))},
		GenerateReceiveMessageInput: func(ctx context.Context, u wsqs.QueueURL) (*sqs.ReceiveMessageInput, error) {
			return &sqs.ReceiveMessageInput{
				QueueUrl:              aws.String(string(u)),
				MessageAttributeNames: []string{"All"},
				WaitTimeSeconds:       20,
				MaxNumberOfMessages:   1,
			}, nil
		},
		Unmarshaler: withSQSMetadata{queueURL: queueURL},
	}
}

// snsSubscriber subscribes the queue (created when missing) to the topic
// once, with watermill-aws's defaults (raw delivery, a queue policy that
// lets the topic send), and returns the subscriber and the queue's URL.
func snsSubscriber(ctx context.Context, cfg aws.Config, topicArn, queue string, visibility time.Duration, logger watermill.LoggerAdapter) (*wsns.Subscriber, string, error) {
	queueURL, err := createQueue(ctx, sqs.NewFromConfig(cfg), queue, visibility)
	if err != nil {
		return nil, "", err
	}
	sub, err := wsns.NewSubscriber(wsns.SubscriberConfig{
		AWSConfig:                  cfg,
		TopicResolver:              wsns.TransparentTopicResolver{},
		GenerateSqsQueueName:       func(context.Context, wsns.TopicArn) (string, error) { return queue, nil },
		DoNotCreateSqsSubscription: true,
	}, subscriberConfig(cfg, queueURL, visibility), logger)
	if err != nil {
		return nil, "", err
	}
	if err := sub.SubscribeInitializeWithContext(ctx, topicArn); err != nil {
		return nil, "", fmt.Errorf("subscribing queue %q to %s: %w", queue, topicArn, err)
	}
	return sub, queueURL, nil
}

// queueDepth returns how many messages the queue holds: waiting, in flight
// and delayed (approximate on AWS, exact on emulators).
func queueDepth(ctx context.Context, client *sqs.Client, queueURL string) (int, error) {
	names := []types.QueueAttributeName{
		types.QueueAttributeNameApproximateNumberOfMessages,
		types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
		types.QueueAttributeNameApproximateNumberOfMessagesDelayed,
	}
	out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queueURL), AttributeNames: names})
	if err != nil {
		return 0, err
	}
	total := 0
	for _, name := range names {
		n, err := strconv.Atoi(out.Attributes[string(name)])
		if err != nil {
			return 0, fmt.Errorf("attribute %s: %w", name, err)
		}
		total += n
	}
	return total, nil
}
