package lab

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
)

// AMQP returns transports on RabbitMQ (watermill-amqp/v3) at uri: each run
// gets its own durable queue (and one for poison messages) on the default
// exchange; every router handler is one more consumer of the queue, on its
// own channel with a prefetch of one, so the handlers compete for the
// messages. A nacked message is requeued and delivered again at once:
// RabbitMQ has no redelivery delay, so the transport's middleware pauses
// NackDelay before the nack (holding that consumer). The queues are
// deleted afterwards.
//
// Pending counts the queue's ready messages: AMQP 0-9-1 does not report
// unacknowledged ones (at most one per handler here); watermill-amqp sends
// an ack before it takes the next delivery.
func AMQP(uri string, consumers int, logger watermill.LoggerAdapter) NewTransportFunc {
	logger = orNop(logger)
	id := watermill.NewShortUUID()
	return func(ctx context.Context, run string) (*Transport, error) {
		queue := "dedup-lab-" + id + "-" + run
		cfg := wmamqp.NewDurableQueueConfig(uri)
		admin, err := amqp.Dial(uri)
		if err != nil {
			return nil, fmt.Errorf("connecting to RabbitMQ: %w", err)
		}
		ch, err := admin.Channel()
		if err != nil {
			_ = admin.Close()
			return nil, err
		}
		pub, err := wmamqp.NewPublisher(cfg, logger)
		if err != nil {
			_ = admin.Close()
			return nil, err
		}
		sub, err := wmamqp.NewSubscriber(cfg, logger)
		if err != nil {
			_ = pub.Close()
			_ = admin.Close()
			return nil, err
		}
		// Declared before anything is published: the default exchange
		// drops a message for a queue that does not exist yet.
		for _, q := range []string{queue, queue + "-poison"} {
			if err := sub.SubscribeInitialize(q); err != nil {
				_ = errors.Join(sub.Close(), pub.Close(), admin.Close())
				return nil, fmt.Errorf("declaring queue %s: %w", q, err)
			}
		}
		return &Transport{
			Publisher: pub, Subscriber: sub, Topic: queue, PoisonTopic: queue + "-poison",
			Consumers:  consumers,
			Middleware: []message.HandlerMiddleware{pauseBeforeNack(NackDelay)},
			Pending: func(context.Context) (int, error) {
				q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
				if err != nil {
					return 0, fmt.Errorf("inspecting queue %s: %w", queue, err)
				}
				return q.Messages, nil
			},
			Close: func() error {
				err := errors.Join(sub.Close(), pub.Close())
				for _, q := range []string{queue, queue + "-poison"} {
					_, delErr := ch.QueueDelete(q, false, false, false)
					err = errors.Join(err, delErr)
				}
				return errors.Join(err, admin.Close())
			},
		}, nil
	}
}

// pauseBeforeNack waits d before passing a handler error on (a nack), so a
// message that cannot be processed yet (its key in progress elsewhere) is
// not redelivered in a busy loop.
func pauseBeforeNack(d time.Duration) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil {
				select {
				case <-time.After(d):
				case <-msg.Context().Done():
				}
			}
			return out, err
		}
	}
}
