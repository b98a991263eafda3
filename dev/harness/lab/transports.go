package lab

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/dev/harness/awsbroker"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/kafkabroker"
)

// NewTransportFunc is the type of Config.NewTransport.
type NewTransportFunc = func(ctx context.Context, run string) (*Transport, error)

// GoChannel returns fresh in-process GoChannel transports: no broker, no
// persistence, a nacked message is offered again at once.
func GoChannel() NewTransportFunc {
	return func(_ context.Context, run string) (*Transport, error) {
		ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1 << 16}, watermill.NopLogger{})
		return &Transport{Publisher: ps, Subscriber: ps, Topic: "orders-" + run, Close: ps.Close}, nil
	}
}

// KafkaPartitions is how many partitions the lab's Kafka topics have: the
// copies of one order land on different partitions, which are consumed
// concurrently, so duplicates race each other.
const KafkaPartitions = 4

// Kafka returns transports on k: each run gets its own topic of
// KafkaPartitions partitions and its own consumer group with one member
// (watermill-kafka/v3, Sarama); a second member would trigger a rebalance
// mid-run, and a rebalance redelivers uncommitted messages, which the run
// without idempotency would charge again (see the examples/kafka test for a
// two-member group). Topics are deleted afterwards unless embedded (an in-process cluster
// that goes away with the process).
func Kafka(k *kafkabroker.Kafka, embedded bool, logger watermill.LoggerAdapter) NewTransportFunc {
	logger = orNop(logger)
	prefix := "dedup-lab-" + watermill.NewShortUUID()
	return func(ctx context.Context, run string) (*Transport, error) {
		topic, group := prefix+"-"+run, prefix+"-"+run+"-charge-orders"
		if err := k.CreateTopic(ctx, topic, KafkaPartitions); err != nil {
			return nil, err
		}
		pub, err := k.Publisher(nil, logger)
		if err != nil {
			return nil, err
		}
		sub, err := k.Subscriber(group, logger)
		if err != nil {
			_ = pub.Close()
			return nil, err
		}
		return &Transport{
			Publisher: pub, Subscriber: sub, Topic: topic, PoisonTopic: topic + "-poison",
			Pending: func(ctx context.Context) (int, error) {
				n, err := k.Lag(ctx, group, topic)
				return int(n), err
			},
			Close: func() error {
				err := errors.Join(sub.Close(), pub.Close())
				if !embedded {
					err = errors.Join(err, k.DeleteTopic(topic), k.DeleteTopic(topic+"-poison"))
				}
				return err
			},
		}, nil
	}
}

// sqsQueue is how the lab's queues are read: the default 30s visibility
// timeout, so a message is never delivered twice because a consumer was
// slow, and RetryAfter(0) on nacks, so an in-progress copy or a lost ack
// comes back at once instead of after those 30s.
var sqsQueue = awsbroker.QueueOptions{VisibilityTimeout: 30 * time.Second, MaxMessages: 1, WaitTime: 5 * time.Second}

// SQS returns transports on SQS: each run gets its own queue, consumed by
// consumers receivers (watermill-aws hands a receiver's messages over one
// at a time, so the receivers are the concurrency). Queues are deleted
// afterwards.
func SQS(a *awsbroker.Broker, consumers int, logger watermill.LoggerAdapter) NewTransportFunc {
	logger = orNop(logger)
	prefix := "dedup-lab-" + watermill.NewShortUUID()
	return func(ctx context.Context, run string) (*Transport, error) {
		queue := prefix + "-" + run
		sub, url, err := a.SQSSubscriber(ctx, queue, sqsQueue, logger)
		if err != nil {
			return nil, err
		}
		pub, err := a.SQSPublisher(logger)
		if err != nil {
			return nil, err
		}
		poison := queue + "-poison"
		return &Transport{
			Publisher: pub, Subscriber: sub, Topic: queue, PoisonTopic: poison,
			Consumers:  consumers,
			Middleware: []message.HandlerMiddleware{a.RetryAfter(0)},
			Pending:    queuePending(a, url),
			Close: func() error {
				err := sub.Close()
				ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
				defer cancel()
				return errors.Join(err, a.DeleteQueue(ctx, url), a.DeleteQueueNamed(ctx, poison))
			},
		}, nil
	}
}

// SNS returns transports on SNS → SQS: each run gets its own topic, with
// its own queue subscribed to it (raw message delivery), consumed by
// consumers receivers. Every copy reaches the queue as a new SQS message
// with a new MessageId. Topics and queues are deleted afterwards.
func SNS(a *awsbroker.Broker, consumers int, logger watermill.LoggerAdapter) NewTransportFunc {
	logger = orNop(logger)
	prefix := "dedup-lab-" + watermill.NewShortUUID()
	return func(ctx context.Context, run string) (*Transport, error) {
		name := prefix + "-" + run
		topicArn, err := a.CreateTopic(ctx, name)
		if err != nil {
			return nil, err
		}
		poisonArn, err := a.CreateTopic(ctx, name+"-poison")
		if err != nil {
			return nil, err
		}
		sub, url, err := a.SNSSubscriber(ctx, topicArn, name+"-charge-orders", sqsQueue, logger)
		if err != nil {
			return nil, err
		}
		pub, err := a.SNSPublisher(logger)
		if err != nil {
			return nil, err
		}
		return &Transport{
			Publisher: pub, Subscriber: sub, Topic: topicArn, PoisonTopic: poisonArn,
			Consumers:  consumers,
			Middleware: []message.HandlerMiddleware{a.RetryAfter(0)},
			Pending:    queuePending(a, url),
			Close: func() error {
				err := sub.Close()
				ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
				defer cancel()
				return errors.Join(err, a.DeleteQueue(ctx, url), a.DeleteTopic(ctx, topicArn), a.DeleteTopic(ctx, poisonArn))
			},
		}, nil
	}
}

// queuePending counts the messages left in a queue: waiting, in flight and
// delayed.
func queuePending(a *awsbroker.Broker, url string) func(context.Context) (int, error) {
	return func(ctx context.Context) (int, error) {
		visible, inFlight, delayed, err := a.QueueDepth(ctx, url)
		if err != nil {
			return 0, fmt.Errorf("reading the depth of %s: %w", url, err)
		}
		return visible + inFlight + delayed, nil
	}
}

// NackDelay is how long the Redis Streams, NATS and RabbitMQ transports wait
// before a nacked message is delivered again: long enough that a copy whose
// key another consumer holds does not come back in a busy loop, short
// enough for a lost ack to be redelivered within the run.
const NackDelay = 50 * time.Millisecond

// cleanupTimeout bounds the deletion of what a run created on the broker.
const cleanupTimeout = 10 * time.Second

func orNop(l watermill.LoggerAdapter) watermill.LoggerAdapter {
	if l == nil {
		return watermill.NopLogger{}
	}
	return l
}
