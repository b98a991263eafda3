// Package awsbroker wires SQS and SNS for the lab and its tests through
// watermill-aws v1.0.1, with the small adapters that version needs: an SNS
// marshaler that publishes with TopicArn (accepted by AWS and by emulators,
// which reject TargetArn), SQS metadata (MessageId, receipt handle, queue
// URL) on received messages, and a middleware that shortens the redelivery
// delay of a nacked message. The configuration comes from internal/awsenv.
package awsbroker

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/watermill-dedup/watermill-dedup/cmd/dedupctl/env/awsenv"
)

// Broker is SQS and SNS reached with one AWS configuration.
type Broker struct {
	AWS *awsenv.AWS
}

// New returns the broker reached with a's configuration.
func New(a *awsenv.AWS) *Broker { return &Broker{AWS: a} }

// SQS returns an SQS client.
func (b *Broker) SQS() *sqs.Client { return sqs.NewFromConfig(b.AWS.Config) }

// SNS returns an SNS client.
func (b *Broker) SNS() *sns.Client { return sns.NewFromConfig(b.AWS.Config) }

// PingSQS checks that SQS answers (one ListQueues call, not retried). The
// error is an *awsenv.UnreachableError naming the endpoint and how to start
// the local emulator.
func (b *Broker) PingSQS(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, awsenv.PingTimeout)
	defer cancel()
	_, err := b.SQS().ListQueues(ctx, &sqs.ListQueuesInput{MaxResults: aws.Int32(1)}, func(o *sqs.Options) { o.RetryMaxAttempts = 1 })
	return b.AWS.Unreachable("sqs", awsenv.FauxqsHint, err)
}

// PingSNS checks that SNS answers (one ListTopics call, not retried).
func (b *Broker) PingSNS(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, awsenv.PingTimeout)
	defer cancel()
	_, err := b.SNS().ListTopics(ctx, &sns.ListTopicsInput{}, func(o *sns.Options) { o.RetryMaxAttempts = 1 })
	return b.AWS.Unreachable("sns", awsenv.FauxqsHint, err)
}
