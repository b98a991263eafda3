package lab

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"
)

// RedisStreamGroup is the consumer group of the lab's streams.
const RedisStreamGroup = "charge-orders"

// RedisStream returns transports on Redis Streams (watermill-redisstream):
// each run gets its own stream, named prefix + an id + "-" + run (keep the
// prefix apart from the store's key prefix),
// read by a consumer group whose consumers compete for its entries; every
// router handler is one more consumer, with its own name and connection.
// newClient returns a new client for the server (a subscriber closes its
// client when it closes). A nacked entry is handed to the same consumer
// again after NackDelay (watermill-redisstream keeps it in the group's
// pending list; without a delay, a copy whose key another consumer holds
// comes back in a busy loop); an entry whose consumer died is claimed by another after
// watermill-redisstream's MaxIdleTime (60s). The streams are deleted
// afterwards.
func RedisStream(newClient func() goredis.UniversalClient, prefix string, consumers int, logger watermill.LoggerAdapter) NewTransportFunc {
	logger = orNop(logger)
	id := watermill.NewShortUUID()
	return func(ctx context.Context, run string) (*Transport, error) {
		stream := prefix + id + "-" + run
		admin := newClient()
		pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: admin}, logger)
		if err != nil {
			_ = admin.Close()
			return nil, err
		}
		sub := &consumerPerSubscribe{newSubscriber: func(name string) (message.Subscriber, error) {
			return redisstream.NewSubscriber(redisstream.SubscriberConfig{
				Client:                        newClient(),
				ConsumerGroup:                 RedisStreamGroup,
				Consumer:                      name,
				NackResendSleep:               NackDelay,
				DisableIndefiniteInitialBlock: true,
			}, logger)
		}}
		return &Transport{
			Publisher: pub, Subscriber: sub, Topic: stream, PoisonTopic: stream + "-poison",
			Consumers: consumers,
			Pending: func(ctx context.Context) (int, error) {
				n, err := admin.XPending(ctx, stream, RedisStreamGroup).Result()
				if err != nil {
					return 0, fmt.Errorf("XPENDING %s: %w", stream, err)
				}
				return int(n.Count), nil
			},
			Close: func() error {
				err := sub.Close()
				ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
				defer cancel()
				err = errors.Join(err, admin.Del(ctx, stream, stream+"-poison").Err())
				return errors.Join(err, admin.Close())
			},
		}, nil
	}
}

// consumerPerSubscribe gives every Subscribe call its own subscriber, named
// "consumer-1", "consumer-2", ...: one more member of a consumer group per
// router handler.
type consumerPerSubscribe struct {
	newSubscriber func(name string) (message.Subscriber, error)

	mu   sync.Mutex
	subs []message.Subscriber
}

func (c *consumerPerSubscribe) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sub, err := c.newSubscriber(fmt.Sprintf("consumer-%d", len(c.subs)+1))
	if err != nil {
		return nil, err
	}
	c.subs = append(c.subs, sub)
	return sub.Subscribe(ctx, topic)
}

// Close closes every subscriber.
func (c *consumerPerSubscribe) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, s := range c.subs {
		errs = append(errs, s.Close())
	}
	c.subs = nil
	return errors.Join(errs...)
}
