package awsbroker

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	wsns "github.com/ThreeDotsLabs/watermill-aws/sns"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
)

// SNSMarshaler is watermill-aws's default SNS marshaler with two changes:
// it publishes with TopicArn instead of TargetArn (both are valid on AWS;
// local emulators such as fauxqs accept only TopicArn), and it drops the
// receive-side metadata of this package (MetaSQS*).
type SNSMarshaler struct{}

// Marshal implements wsns.Marshaler.
func (SNSMarshaler) Marshal(topicArn wsns.TopicArn, msg *message.Message) *sns.PublishInput {
	in := wsns.DefaultMarshalerUnmarshaler{}.Marshal(topicArn, withoutSQSMeta(msg))
	in.TopicArn, in.TargetArn = in.TargetArn, nil
	return in
}

// CreateTopic creates the SNS topic name (or finds the existing one: the
// call is idempotent) and returns its ARN. Create the topic before
// subscribing a queue to it.
func (b *Broker) CreateTopic(ctx context.Context, name string) (string, error) {
	out, err := b.SNS().CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(name)})
	if err != nil {
		return "", fmt.Errorf("awsbroker: creating SNS topic %q: %w", name, err)
	}
	return aws.ToString(out.TopicArn), nil
}

// DeleteTopic deletes the topic and its subscriptions.
func (b *Broker) DeleteTopic(ctx context.Context, arn string) error {
	_, err := b.SNS().DeleteTopic(ctx, &sns.DeleteTopicInput{TopicArn: aws.String(arn)})
	return err
}

// SNSPublisher returns a watermill-aws SNS publisher; the topic passed to
// Publish is the topic ARN (see CreateTopic).
func (b *Broker) SNSPublisher(logger watermill.LoggerAdapter) (*wsns.Publisher, error) {
	return wsns.NewPublisher(wsns.PublisherConfig{
		AWSConfig:                   b.AWS.Config,
		TopicResolver:               wsns.TransparentTopicResolver{},
		Marshaler:                   SNSMarshaler{},
		DoNotCreateTopicIfNotExists: true,
	}, logger)
}

// SNSSubscriber subscribes the SQS queue named queue (created when missing,
// with opts) to the topic topicArn, once, with watermill-aws's defaults (raw
// message delivery, a queue policy that lets the topic send), and returns a
// watermill-aws SNS subscriber for it; Subscribe takes the topic ARN. Its
// Subscribe calls do not subscribe again, so several of them (one per
// router handler) compete for the queue's messages like SQSSubscriber's.
func (b *Broker) SNSSubscriber(ctx context.Context, topicArn, queue string, opts QueueOptions, logger watermill.LoggerAdapter) (sub *wsns.Subscriber, url string, err error) {
	url, err = b.CreateQueue(ctx, queue, opts)
	if err != nil {
		return nil, "", err
	}
	sub, err = wsns.NewSubscriber(wsns.SubscriberConfig{
		AWSConfig:                  b.AWS.Config,
		TopicResolver:              wsns.TransparentTopicResolver{},
		GenerateSqsQueueName:       func(context.Context, wsns.TopicArn) (string, error) { return queue, nil },
		DoNotCreateSqsSubscription: true,
	}, b.sqsSubscriberConfig(url, opts), logger)
	if err != nil {
		return nil, "", err
	}
	if err := sub.SubscribeInitializeWithContext(ctx, topicArn); err != nil {
		return nil, "", fmt.Errorf("awsbroker: subscribing queue %q to %s: %w", queue, topicArn, err)
	}
	return sub, url, nil
}
