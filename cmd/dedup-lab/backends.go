package main

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/brokers"
	"github.com/watermill-dedup/watermill-dedup/internal/lab"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
	redisstore "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// options is what the backends are built from: flags, whose defaults come
// from the standard environment variables.
type options struct {
	concurrency  int
	kafkaBrokers string // KAFKA_BROKERS; empty: embedded kfake
	redisAddr    string // REDIS_ADDR; empty: embedded miniredis
	dynamoTable  string
	logger       watermill.LoggerAdapter
}

// broker creates one transport per lab run.
type broker struct {
	transport func(ctx context.Context, run string) (*lab.Transport, error)
	// about says where the broker runs, for the output; empty for
	// GoChannel (the default output stays as it was).
	about string
	close func()
}

// store gives the lab its dedup store.
type store struct {
	store func(ctx context.Context) (dedup.Store, error)
	about string // empty for the memory store
	close func()
}

// setupError is a backend that cannot be reached, with a one-line hint on
// how to start a local one.
type setupError struct {
	err  error
	hint string
}

func (e *setupError) Error() string { return e.err.Error() }
func (e *setupError) Unwrap() error { return e.err }

var brokerNames = map[string]func(ctx context.Context, o options) (*broker, error){
	"gochannel": newGoChannelBroker,
	"kafka":     newKafkaBroker,
	"sqs":       newSQSBroker,
	"sns":       newSNSBroker,
}

var storeNames = map[string]func(ctx context.Context, o options) (*store, error){
	"memory": newMemoryStore,
	"redis":  newRedisStore,
	"dynamo": newDynamoStore,
}

func newGoChannelBroker(context.Context, options) (*broker, error) {
	return &broker{transport: lab.GoChannel(), close: func() {}}, nil
}

func newKafkaBroker(_ context.Context, o options) (*broker, error) {
	k, err := brokers.ConnectKafka(o.kafkaBrokers, 1)
	if err != nil {
		return nil, err
	}
	about := fmt.Sprintf("%s, %d partitions per topic, one consumer group per run", k.Describe(), lab.KafkaPartitions)
	if k.Embedded {
		about += " (set KAFKA_BROKERS for real brokers)"
	}
	return &broker{transport: lab.Kafka(k, o.logger), about: about, close: k.Close}, nil
}

// loadAWS loads the AWS configuration for services and checks that each
// answers.
func loadAWS(ctx context.Context, hint string, services ...string) (*brokers.AWS, error) {
	a, err := brokers.LoadAWS(ctx, services...)
	if err != nil {
		return nil, &setupError{err: err, hint: hint}
	}
	for _, s := range services {
		var err error
		switch s {
		case "sqs":
			err = a.PingSQS(ctx)
		case "sns":
			err = a.PingSNS(ctx)
		case "dynamodb":
			err = a.PingDynamoDB(ctx)
		}
		if err != nil {
			return nil, &setupError{err: err, hint: hint}
		}
	}
	return a, nil
}

func newSQSBroker(ctx context.Context, o options) (*broker, error) {
	a, err := loadAWS(ctx, brokers.FauxqsHint, "sqs")
	if err != nil {
		return nil, err
	}
	about := fmt.Sprintf("SQS at %s, one queue per run, %d receivers", a.Describe("sqs"), o.concurrency)
	return &broker{transport: lab.SQS(a, o.concurrency, o.logger), about: about, close: func() {}}, nil
}

func newSNSBroker(ctx context.Context, o options) (*broker, error) {
	a, err := loadAWS(ctx, brokers.FauxqsHint, "sqs", "sns")
	if err != nil {
		return nil, err
	}
	about := fmt.Sprintf("SNS at %s fanning out to an SQS queue, one topic and queue per run, %d receivers", a.Describe("sns"), o.concurrency)
	return &broker{transport: lab.SNS(a, o.concurrency, o.logger), about: about, close: func() {}}, nil
}

func newMemoryStore(context.Context, options) (*store, error) {
	s := memory.New(nil)
	return &store{store: func(context.Context) (dedup.Store, error) { return s, nil }, close: func() {}}, nil
}

func newRedisStore(ctx context.Context, o options) (*store, error) {
	r, err := brokers.ConnectRedis(o.redisAddr)
	if err != nil {
		return nil, err
	}
	s, err := r.Store(ctx, redisstore.Config{KeyPrefix: "dedup-lab:"})
	if err != nil {
		r.Close()
		return nil, &setupError{err: err, hint: "start one with `redis-server --bind 127.0.0.1 --port 6379` and set REDIS_ADDR=127.0.0.1:6379, or unset REDIS_ADDR for the embedded one"}
	}
	about := r.Describe()
	if r.Embedded {
		about += " (set REDIS_ADDR for a real server)"
	}
	return &store{store: func(context.Context) (dedup.Store, error) { return s, nil }, about: about, close: r.Close}, nil
}

func newDynamoStore(ctx context.Context, o options) (*store, error) {
	a, err := loadAWS(ctx, brokers.DynaliteHint, "dynamodb")
	if err != nil {
		return nil, err
	}
	s, err := a.DynamoStore(ctx, o.dynamoTable)
	if err != nil {
		return nil, err
	}
	return &store{
		store: func(context.Context) (dedup.Store, error) { return s, nil },
		about: fmt.Sprintf("DynamoDB at %s, table %s", a.Describe("dynamodb"), o.dynamoTable),
		close: func() {},
	}, nil
}
