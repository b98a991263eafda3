package lab

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSGroup is the durable consumer group of the lab's JetStream streams.
const NATSGroup = "charge-orders"

// NATS returns transports on NATS JetStream (watermill-nats/v2
// pkg/jetstream) at url: each run gets its own stream (and one for poison
// messages), read through one durable pull consumer that every router
// handler pulls from, one message at a time (a queue group: the handlers
// compete for the messages). A nacked message is redelivered by the server
// after NackDelay (NakWithDelay); one whose consumer did not answer within AckWait (30s)
// is redelivered to any puller. The streams are deleted afterwards.
func NATS(url string, consumers int, logger watermill.LoggerAdapter) NewTransportFunc {
	logger = orNop(logger)
	id := watermill.NewShortUUID()
	return func(ctx context.Context, run string) (*Transport, error) {
		stream := "dedup-lab-" + id + "-" + run
		admin, err := nats.Connect(url)
		if err != nil {
			return nil, fmt.Errorf("connecting to NATS at %s: %w", url, err)
		}
		js, err := jetstream.New(admin)
		if err != nil {
			admin.Close()
			return nil, err
		}
		for _, name := range []string{stream, stream + "-poison"} {
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name}}); err != nil {
				admin.Close()
				return nil, fmt.Errorf("creating JetStream stream %s: %w", name, err)
			}
		}
		pub, err := wmjs.NewPublisher(wmjs.PublisherConfig{URL: url, Logger: logger})
		if err != nil {
			admin.Close()
			return nil, err
		}
		sub, err := wmjs.NewSubscriber(wmjs.SubscriberConfig{
			URL:                 url,
			Logger:              logger,
			ResourceInitializer: wmjs.GroupedConsumer(NATSGroup),
			NakDelay:            wmjs.NewStaticDelay(NackDelay),
			// One message at a time per puller: a busy handler does not
			// hold a batch that the others could take.
			ConsumeOptions: []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(1)},
		})
		if err != nil {
			_ = pub.Close()
			admin.Close()
			return nil, err
		}
		return &Transport{
			Publisher: pub, Subscriber: sub, Topic: stream, PoisonTopic: stream + "-poison",
			Consumers: consumers,
			Pending: func(ctx context.Context) (int, error) {
				return natsPending(ctx, js, stream)
			},
			Close: func() error {
				err := errors.Join(sub.Close(), pub.Close())
				ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
				defer cancel()
				err = errors.Join(err, js.DeleteStream(ctx, stream), js.DeleteStream(ctx, stream+"-poison"))
				admin.Close()
				return err
			},
		}, nil
	}
}

// natsPending counts the messages of stream the lab's consumer has not
// acked: not delivered yet, or delivered and waiting for an ack.
func natsPending(ctx context.Context, js jetstream.JetStream, stream string) (int, error) {
	c, err := js.Consumer(ctx, stream, NATSConsumerName(stream))
	if err != nil {
		return 0, fmt.Errorf("consumer of %s: %w", stream, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int(info.NumPending) + info.NumAckPending, nil
}

// NATSConsumerName is the durable consumer watermill-nats creates for the
// lab's group on topic.
func NATSConsumerName(topic string) string { return "watermill__" + NATSGroup + "__" + topic }
