package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/ThreeDotsLabs/watermill"

	amqp "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/cmd/dedupctl/env/awsenv"
	"github.com/watermill-dedup/watermill-dedup/cmd/dedupctl/env/redisaddr"
	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/awsbroker"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/embedded"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/kafkabroker"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/lab"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// options is what the backends are built from: flags, whose defaults come
// from the standard environment variables.
type options struct {
	concurrency  int
	kafkaBrokers string // KAFKA_BROKERS; empty: embedded kfake
	natsURL      string // NATS_URL; empty: embedded nats-server
	amqpURL      string // AMQP_URL; required for -broker amqp
	dynamoTable  string
	logger       watermill.LoggerAdapter
	// redis is the one Redis server of the run (REDIS_ADDR, or an embedded
	// miniredis), shared by -store redis and -broker redisstream.
	redis *sharedRedis
}

// sharedRedis opens the Redis server on first use and closes it at the end.
type sharedRedis struct {
	addr string // REDIS_ADDR; empty: embedded miniredis

	client goredis.UniversalClient
	mini   *embedded.Redis
}

// get connects to the server, or starts the embedded one, once.
func (r *sharedRedis) get() (goredis.UniversalClient, error) {
	if r.client != nil {
		return r.client, nil
	}
	client, err := redisaddr.Client(r.addr)
	if errors.Is(err, redisaddr.ErrEmpty) {
		if r.mini, err = embedded.StartRedis(); err != nil {
			return nil, err
		}
		client = goredis.NewClient(&goredis.Options{Addr: r.mini.Addr})
	}
	if err != nil {
		return nil, err
	}
	r.client = client
	return client, nil
}

// newClient returns one more client for the server (get first).
func (r *sharedRedis) newClient() goredis.UniversalClient {
	if r.mini != nil {
		return goredis.NewClient(&goredis.Options{Addr: r.mini.Addr})
	}
	c, _ := redisaddr.Client(r.addr) // parsed by get already
	return c
}

// describe names the server for the output.
func (r *sharedRedis) describe() string {
	if r.mini != nil {
		return "embedded Redis (miniredis, in this process) at " + r.mini.Addr + " (set REDIS_ADDR for a real server)"
	}
	return "Redis at " + redisaddr.Describe(r.client)
}

func (r *sharedRedis) close() {
	if r.client != nil {
		_ = r.client.Close()
	}
	if r.mini != nil {
		r.mini.Close()
	}
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
	// leaves, for a store that outlives the process (a real server), says
	// what an idempotent run on scope left in it; nil otherwise.
	leaves func(scope string, records int) string
	close  func()
	// txCharges gives -effect-in-tx its charges table; nil where the store
	// has no transaction of its own (memory).
	txCharges func(ctx context.Context) (lab.TxCharges, error)
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
	"gochannel":   newGoChannelBroker,
	"kafka":       newKafkaBroker,
	"sqs":         newSQSBroker,
	"sns":         newSNSBroker,
	"redisstream": newRedisStreamBroker,
	"nats":        newNATSBroker,
	"amqp":        newAMQPBroker,
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
	k := &kafkabroker.Kafka{Brokers: kafkabroker.ParseBrokers(o.kafkaBrokers)}
	if len(k.Brokers) > 0 {
		about := fmt.Sprintf("Kafka at %s, %d partitions per topic, one consumer group per run", strings.Join(k.Brokers, ","), lab.KafkaPartitions)
		return &broker{transport: lab.Kafka(k, false, o.logger), about: about, close: func() {}}, nil
	}
	cluster, err := embedded.StartKafka(1)
	if err != nil {
		return nil, err
	}
	k.Brokers = cluster.Addrs
	about := fmt.Sprintf("embedded Kafka (kfake) at %s, %d partitions per topic, one consumer group per run (set KAFKA_BROKERS for real brokers)",
		strings.Join(k.Brokers, ","), lab.KafkaPartitions)
	return &broker{transport: lab.Kafka(k, true, o.logger), about: about, close: cluster.Close}, nil
}

// loadAWS loads the AWS configuration for services and checks that each
// answers.
func loadAWS(ctx context.Context, hint string, services ...string) (*awsenv.AWS, error) {
	a, err := awsenv.LoadAWS(ctx, services...)
	if err != nil {
		return nil, &setupError{err: err, hint: hint}
	}
	b := awsbroker.New(a)
	for _, s := range services {
		var err error
		switch s {
		case "sqs":
			err = b.PingSQS(ctx)
		case "sns":
			err = b.PingSNS(ctx)
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
	a, err := loadAWS(ctx, awsenv.FauxqsHint, "sqs")
	if err != nil {
		return nil, err
	}
	about := fmt.Sprintf("SQS at %s, one queue per run, %d receivers", a.Describe("sqs"), o.concurrency)
	return &broker{transport: lab.SQS(awsbroker.New(a), o.concurrency, o.logger), about: about, close: func() {}}, nil
}

func newSNSBroker(ctx context.Context, o options) (*broker, error) {
	a, err := loadAWS(ctx, awsenv.FauxqsHint, "sqs", "sns")
	if err != nil {
		return nil, err
	}
	about := fmt.Sprintf("SNS at %s fanning out to an SQS queue, one topic and queue per run, %d receivers", a.Describe("sns"), o.concurrency)
	return &broker{transport: lab.SNS(awsbroker.New(a), o.concurrency, o.logger), about: about, close: func() {}}, nil
}

func newRedisStreamBroker(ctx context.Context, o options) (*broker, error) {
	client, err := o.redis.get()
	if err != nil {
		return nil, err
	}
	if err := client.Ping(ctx).Err(); err != nil {
		return nil, &setupError{err: err, hint: redisHint}
	}
	about := fmt.Sprintf("Redis Streams on %s, one stream per run, consumer group %q of %d consumers",
		o.redis.describe(), lab.RedisStreamGroup, o.concurrency)
	return &broker{transport: lab.RedisStream(o.redis.newClient, labStreamPrefix, o.concurrency, o.logger), about: about, close: func() {}}, nil
}

func newNATSBroker(_ context.Context, o options) (*broker, error) {
	if o.natsURL != "" {
		about := fmt.Sprintf("NATS JetStream at %s, one stream per run, durable consumer %q pulled by %d handlers", o.natsURL, lab.NATSGroup, o.concurrency)
		return &broker{transport: lab.NATS(o.natsURL, o.concurrency, o.logger), about: about, close: func() {}}, nil
	}
	n, err := embedded.StartNATS()
	if err != nil {
		return nil, err
	}
	about := fmt.Sprintf("embedded NATS JetStream (nats-server, in this process) at %s, one stream per run, durable consumer %q pulled by %d handlers (set NATS_URL for a real server)",
		n.URL, lab.NATSGroup, o.concurrency)
	return &broker{transport: lab.NATS(n.URL, o.concurrency, o.logger), about: about, close: n.Close}, nil
}

// amqpHint says how to start a local RabbitMQ for -broker amqp.
const amqpHint = "start RabbitMQ (Debian package rabbitmq-server: `sudo service rabbitmq-server start` listens on 127.0.0.1:5672; " +
	"dev/lab/README.md shows a throwaway node) and set AMQP_URL=amqp://guest:guest@127.0.0.1:5672/"

func newAMQPBroker(_ context.Context, o options) (*broker, error) {
	if o.amqpURL == "" {
		return nil, &setupError{err: errors.New("no RabbitMQ: AMQP_URL is not set (there is no embedded RabbitMQ)"), hint: amqpHint}
	}
	conn, err := amqp.Dial(o.amqpURL)
	if err != nil {
		return nil, &setupError{err: fmt.Errorf("RabbitMQ at %s: %w", redactURL(o.amqpURL), err), hint: amqpHint}
	}
	_ = conn.Close()
	about := fmt.Sprintf("RabbitMQ at %s, one durable queue per run, %d consumers (prefetch 1)", redactURL(o.amqpURL), o.concurrency)
	return &broker{transport: lab.AMQP(o.amqpURL, o.concurrency, o.logger), about: about, close: func() {}}, nil
}

// redactURL drops the password of a URL for the output.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

func newMemoryStore(ctx context.Context, _ options) (*store, error) {
	s, err := memory.New(ctx, memory.Config{})
	if err != nil {
		return nil, err
	}
	return &store{store: func(context.Context) (dedup.Store, error) { return s, nil }, close: func() {}}, nil
}

// redisHint says how to get a Redis server that answers.
const redisHint = "start one with `redis-server --bind 127.0.0.1 --port 6379` and set REDIS_ADDR=127.0.0.1:6379, or unset REDIS_ADDR for the embedded one"

// labKeyPrefix is the lab's own key prefix on a shared Redis: every key it
// writes starts with it (see README.md for what a run leaves behind).
const labKeyPrefix = "dedup-lab:"

// labStreamPrefix starts the names of the lab's Redis streams (deleted after
// each run), apart from the store's keys.
const labStreamPrefix = "dedup-lab-stream-"

func newRedisStore(ctx context.Context, o options) (*store, error) {
	client, err := o.redis.get()
	if err != nil {
		return nil, err
	}
	s, err := dedupredis.New(ctx, dedupredis.Config{Client: client, KeyPrefix: labKeyPrefix})
	if err != nil {
		return nil, &setupError{err: err, hint: redisHint}
	}
	about := o.redis.describe() + ", key prefix " + labKeyPrefix
	st := &store{store: func(context.Context) (dedup.Store, error) { return s, nil }, about: about, close: func() {},
		txCharges: func(context.Context) (lab.TxCharges, error) { return lab.RedisTxCharges(s, client), nil }}
	if o.redis.mini == nil { // a real server: the records outlive the run
		st.leaves = func(scope string, records int) string {
			return fmt.Sprintf("%d records, keys %s%s:ORDER-…, each kept for its retention (%v) unless evicted: dedupctl -redis-addr %s -redis-prefix %s list -scope %s",
				records, labKeyPrefix, scope, lab.Retention, o.redis.addr, labKeyPrefix, scope)
		}
	}
	return st, nil
}

// motoHint says how to get a DynamoDB emulator with transactions.
const motoHint = "-effect-in-tx needs TransactWriteItems, which dynalite lacks: run moto's server " +
	"(`python3 -m pip install 'moto[server]'` then `moto_server -H 127.0.0.1 -p 5000`) and set AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:5000, or use AWS"

func newDynamoStore(ctx context.Context, o options) (*store, error) {
	a, err := loadAWS(ctx, awsenv.DynaliteHint, "dynamodb")
	if err != nil {
		return nil, err
	}
	s, err := lab.DynamoStore(ctx, a.DynamoDB(), o.dynamoTable)
	if err != nil {
		return nil, err
	}
	return &store{
		store: func(context.Context) (dedup.Store, error) { return s, nil },
		about: fmt.Sprintf("DynamoDB at %s, table %s", a.Describe("dynamodb"), o.dynamoTable),
		leaves: func(scope string, records int) string {
			return fmt.Sprintf("%d items in table %s, keys %s:ORDER-…, each counted for its retention (%v) and deleted by Time to Live where the table has it: dedupctl -store dynamo -dynamo-table %s list -scope %s",
				records, o.dynamoTable, scope, lab.Retention, o.dynamoTable, scope)
		},
		close: func() {},
		txCharges: func(ctx context.Context) (lab.TxCharges, error) {
			tc, err := lab.DynamoTxCharges(ctx, s, a.DynamoDB(), o.dynamoTable+"-charges")
			if err != nil {
				return nil, &setupError{err: err, hint: motoHint}
			}
			return tc, nil
		},
	}, nil
}
