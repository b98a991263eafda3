package lab_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/cmd/dedupctl/env/awsenv"
	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/awsbroker"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/embedded"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/kafkabroker"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/lab"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// The servers every broker and store test shares: a real redis-server
// (store and Redis Streams), dynalite (DynamoDB), fauxqs (SQS and SNS) and a
// RabbitMQ node, each on free 127.0.0.1 ports, and an in-process NATS
// server; the AWS SDK finds the emulators through the standard endpoint
// variables, as the lab and the examples do. Kafka is an in-process kfake
// cluster per test.
var (
	redisAddr string
	natsURL   string
	amqpURL   string
)

func TestMain(m *testing.M) {
	testserver.Main(m, func() (func(), error) {
		var closers []func()
		cleanup := func() {
			for _, c := range closers {
				c()
			}
		}
		r, err := testserver.StartRedis()
		if err != nil {
			return nil, err
		}
		closers = append(closers, func() { _ = r.Close() })
		dyn, err := testserver.StartDynalite()
		if err != nil {
			cleanup()
			return nil, err
		}
		closers = append(closers, func() { _ = dyn.Close() })
		fq, err := testserver.StartFauxqs()
		if err != nil {
			cleanup()
			return nil, err
		}
		closers = append(closers, func() { _ = fq.Close() })
		rabbit, err := testserver.StartRabbitMQ()
		if err != nil {
			cleanup()
			return nil, err
		}
		closers = append(closers, func() { _ = rabbit.Close() })
		n, err := embedded.StartNATS()
		if err != nil {
			cleanup()
			return nil, err
		}
		closers = append(closers, n.Close)
		redisAddr, natsURL, amqpURL = r.Addr, n.URL, rabbit.URL
		if err := setSharedConfig(); err != nil {
			cleanup()
			return nil, err
		}
		for k, v := range map[string]string{
			"AWS_ENDPOINT_URL":          "",
			"AWS_ENDPOINT_URL_SQS":      fq.Endpoint,
			"AWS_ENDPOINT_URL_SNS":      fq.Endpoint,
			"AWS_ENDPOINT_URL_DYNAMODB": dyn.Endpoint,
		} {
			if err := os.Setenv(k, v); err != nil {
				cleanup()
				return nil, err
			}
		}
		return cleanup, nil
	})
}

func loadAWS(t *testing.T, services ...string) *awsenv.AWS {
	t.Helper()
	a, err := awsenv.LoadAWS(context.Background(), services...)
	if err != nil {
		t.Fatal(err)
	}
	if !a.Local {
		t.Fatalf("AWS configuration for %v is not local: %v", services, a)
	}
	return a
}

type storeKind string

const (
	redisStore  storeKind = "redis"
	dynamoStore storeKind = "dynamo"
)

func newStore(t *testing.T, kind storeKind) func(context.Context) (dedup.Store, error) {
	t.Helper()
	switch kind {
	case redisStore:
		client := goredis.NewClient(&goredis.Options{Addr: redisAddr})
		t.Cleanup(func() { _ = client.Close() })
		return func(ctx context.Context) (dedup.Store, error) {
			return dedupredis.New(ctx, dedupredis.Config{Client: client, KeyPrefix: "lab-test:"})
		}
	case dynamoStore:
		a := loadAWS(t, "dynamodb")
		return func(ctx context.Context) (dedup.Store, error) {
			return lab.DynamoStore(ctx, a.DynamoDB(), "dedup-lab-test")
		}
	}
	t.Fatalf("unknown store %q", kind)
	return nil
}

// checkRuns asserts what the lab is for, on one broker and store:
// idempotency off charges every delivery (each copy, and again each copy
// whose ack was lost); on charges each distinct order once, however many
// copies and redeliveries arrive; every message is acked and none is left
// in the broker (SQS: no message waiting or in flight; Kafka: every offset
// committed).
func checkRuns(t *testing.T, cfg lab.Config) {
	t.Helper()
	results, err := lab.Run(context.Background(), cfg, true, true)
	var table strings.Builder
	lab.PrintTable(&table, results)
	t.Logf("%s on %s:\n%s", cfg.Broker, cfg.StoreName, table.String())
	for _, r := range results {
		t.Logf("idempotency %v: %.2fs", r.Idempotency, r.Elapsed.Seconds())
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 {
		t.Fatalf("%d results, want 2", len(results))
	}
	off, on := results[0], results[1]
	for _, r := range results {
		if r.Acked != r.Messages {
			t.Errorf("idempotency %v: %d of %d messages acked", r.Idempotency, r.Acked, r.Messages)
		}
		if r.Pending != 0 {
			t.Errorf("idempotency %v: %d messages left in the broker", r.Idempotency, r.Pending)
		}
		if r.LostAcks != cfg.LoseAcks {
			t.Errorf("idempotency %v: %d acks lost, want %d", r.Idempotency, r.LostAcks, cfg.LoseAcks)
		}
	}
	if off.Charges != off.Messages+off.LostAcks {
		t.Errorf("off: %d charges for %d messages and %d redeliveries", off.Charges, off.Messages, off.LostAcks)
	}
	if on.Charges != on.DistinctOrders {
		t.Errorf("on: %d charges for %d distinct orders", on.Charges, on.DistinctOrders)
	}
	won, dup := on.Outcomes[event.ClaimWon], on.Outcomes[event.SkipDuplicate]
	if won != on.DistinctOrders {
		t.Errorf("on: claim won %d times for %d orders", won, on.DistinctOrders)
	}
	// Every delivery that ended in an ack was either the winner or a
	// skipped duplicate; a redelivered lost ack is one more delivery.
	if won+dup != on.Messages+on.LostAcks {
		t.Errorf("on: %d claims won + %d duplicates skipped != %d messages + %d redeliveries", won, dup, on.Messages, on.LostAcks)
	}
	if released, lost := on.Outcomes[event.Released], on.Outcomes[event.ClaimLost]; released != 0 || lost != 0 {
		t.Errorf("on: %d released, %d claims lost", released, lost)
	}
	if !off.OK() || !on.OK() {
		t.Errorf("OK() = %v, %v", off.OK(), on.OK())
	}
}

func labConfig(broker string, store storeKind, transport lab.NewTransportFunc, t *testing.T) lab.Config {
	return lab.Config{
		Copies: 10, Orders: 100, MaxDuplicates: 3, Concurrency: 8,
		EffectTime: time.Millisecond, LoseAcks: 10, Seed: 5, Timeout: time.Minute,
		Broker: broker, StoreName: string(store),
		NewTransport: transport, NewStore: newStore(t, store),
	}
}

func TestLabOnKafka(t *testing.T) {
	t.Parallel()
	cluster, err := embedded.StartKafka(1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	k := &kafkabroker.Kafka{Brokers: cluster.Addrs}
	for _, store := range []storeKind{redisStore, dynamoStore} {
		t.Run(string(store), func(t *testing.T) {
			checkRuns(t, labConfig("kafka", store, lab.Kafka(k, true, watermill.NopLogger{}), t))
		})
	}
}

func TestLabOnSQS(t *testing.T) {
	t.Parallel()
	a := awsbroker.New(loadAWS(t, "sqs"))
	for _, store := range []storeKind{redisStore, dynamoStore} {
		t.Run(string(store), func(t *testing.T) {
			checkRuns(t, labConfig("sqs", store, lab.SQS(a, 8, watermill.NopLogger{}), t))
		})
	}
}

func TestLabOnSNS(t *testing.T) {
	t.Parallel()
	a := awsbroker.New(loadAWS(t, "sqs", "sns"))
	for _, store := range []storeKind{redisStore, dynamoStore} {
		t.Run(string(store), func(t *testing.T) {
			checkRuns(t, labConfig("sns", store, lab.SNS(a, 8, watermill.NopLogger{}), t))
		})
	}
}

func newRedisClient() goredis.UniversalClient {
	return goredis.NewClient(&goredis.Options{Addr: redisAddr})
}

// Redis Streams on the redis-server that also holds the store: a whole
// local stack on one Redis.
func TestLabOnRedisStream(t *testing.T) {
	t.Parallel()
	checkRuns(t, labConfig("redisstream", redisStore, lab.RedisStream(newRedisClient, "lab-test-stream-", 8, nil), t))
}

func TestLabOnNATS(t *testing.T) {
	t.Parallel()
	for _, store := range []storeKind{redisStore, dynamoStore} {
		t.Run(string(store), func(t *testing.T) {
			checkRuns(t, labConfig("nats", store, lab.NATS(natsURL, 8, nil), t))
		})
	}
}

func TestLabOnAMQP(t *testing.T) {
	t.Parallel()
	checkRuns(t, labConfig("amqp", redisStore, lab.AMQP(amqpURL, 8, nil), t))
}

// The lab deletes what it created on the broker.
func TestLabCleansUpSQS(t *testing.T) {
	t.Parallel()
	a := awsbroker.New(loadAWS(t, "sqs", "sns"))
	ctx := context.Background()
	for _, tr := range []lab.NewTransportFunc{lab.SQS(a, 1, nil), lab.SNS(a, 1, nil)} {
		x, err := tr(ctx, "cleanup")
		if err != nil {
			t.Fatal(err)
		}
		if err := x.Close(); err != nil {
			t.Fatal(err)
		}
	}
	queues, err := a.SQS().ListQueues(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range queues.QueueUrls {
		if strings.Contains(q, "-cleanup") {
			t.Errorf("queue %s left behind", q)
		}
	}
	topics, err := a.SNS().ListTopics(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range topics.Topics {
		if strings.Contains(fmt.Sprint(*tp.TopicArn), "-cleanup") {
			t.Errorf("topic %s left behind", *tp.TopicArn)
		}
	}
}
