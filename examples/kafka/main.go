// Command kafka is the "charge order" consumer on Kafka: watermill-kafka/v3
// (Sarama) in a consumer group whose members share one Deduplicator, so
// each order is charged once however many copies are produced and
// whichever partition and member they land on. The key is the order id,
// taken from a Kafka header when the producer set one and from the JSON
// body otherwise.
//
//	go run ./examples/kafka                                 # embedded Kafka (kfake) and Redis (miniredis)
//	KAFKA_BROKERS=broker1:9092 REDIS_ADDR=my-redis:6379 go run ./examples/kafka
//	AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:4567 go run ./examples/kafka -store dynamo
//
// Without KAFKA_BROKERS it starts an in-process Kafka-protocol cluster, so
// it runs with no setup. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/brokers"
	redisstore "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// config is the command line.
type config struct {
	kafkaBrokers string // empty: embedded kfake
	store        string // redis or dynamo
	redisAddr    string // empty: embedded miniredis
	dynamoTable  string
	topic        string
	group        string
	partitions   int
	members      int
	scope        string
	idempotency  bool
	consume      bool
	timeout      time.Duration
	verbose      bool
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("kafka", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.kafkaBrokers, "kafka-brokers", os.Getenv(brokers.KafkaBrokersEnv), "Kafka bootstrap brokers, comma-separated (default $KAFKA_BROKERS; empty: embedded kfake cluster)")
	fs.StringVar(&c.store, "store", "redis", "dedup store: redis or dynamo")
	fs.StringVar(&c.redisAddr, "redis-addr", os.Getenv(brokers.RedisAddrEnv), "Redis server (default $REDIS_ADDR; empty: embedded miniredis)")
	fs.StringVar(&c.dynamoTable, "dynamo-table", "dedup-example", "DynamoDB table (created if missing)")
	fs.StringVar(&c.topic, "topic", "orders-demo", "Kafka topic (created if missing)")
	fs.StringVar(&c.group, "group", "charge-orders-demo", "consumer group")
	fs.IntVar(&c.partitions, "partitions", 4, "partitions of the topic, when this creates it")
	fs.IntVar(&c.members, "members", 2, "consumer group members in this process")
	fs.StringVar(&c.scope, "scope", "charge-order", "dedup scope shared by the members")
	fs.BoolVar(&c.idempotency, "idempotency", true, "deduplicate (false: charge every copy)")
	fs.BoolVar(&c.consume, "consume", false, "only consume, until interrupted; publish no demo orders")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "give the demo up after this long")
	fs.BoolVar(&c.verbose, "v", false, "log Watermill's and the middleware's events")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.store != "redis" && c.store != "dynamo" {
		return c, fmt.Errorf("-store must be redis or dynamo, not %q", c.store)
	}
	if c.members < 1 || c.partitions < 1 {
		return c, errors.New("-members and -partitions must be at least 1")
	}
	return c, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "kafka:", err)
		}
		return 2
	}
	out := lockWriter(stdout)
	k, err := brokers.ConnectKafka(cfg.kafkaBrokers, 1)
	if err != nil {
		fmt.Fprintln(stderr, "kafka:", err)
		return 1
	}
	defer k.Close()
	if err := runWith(ctx, cfg, k, demoOrders, newLedger(out), newPrinter(out), out); err != nil {
		fmt.Fprintln(stderr, "kafka:", err)
		var ue *brokers.UnreachableError
		if errors.As(err, &ue) {
			fmt.Fprintln(stderr, "hint:", ue.Hint)
		}
		return 1
	}
	return 0
}

// publication is one order produced copies times (a producer retrying):
// every copy is a new Kafka record with a new Watermill UUID.
type publication struct {
	order  order
	copies int
	// header: the producer puts the order id in the order_id header too.
	header bool
	// failFirst makes the first charge of the order fail.
	failFirst bool
}

// demoOrders: 8 messages, 3 distinct orders. One producer sets the order_id
// header, another does not; the first charge of ORDER-004 fails.
var demoOrders = []publication{
	{order: order{"ORDER-001", 100, "BRL"}, copies: 1, header: true},
	{order: order{"ORDER-003", 150, "BRL"}, copies: 3, header: true},
	{order: order{"ORDER-003", 150, "BRL"}, copies: 2},
	{order: order{"ORDER-004", 80, "BRL"}, copies: 2, failFirst: true},
}

// openStore opens the dedup store: Redis (REDIS_ADDR, or an embedded
// miniredis) or DynamoDB (the AWS SDK's environment).
func openStore(ctx context.Context, cfg config) (dedup.Store, string, func(), error) {
	if cfg.store == "dynamo" {
		a, err := brokers.LoadAWS(ctx, "dynamodb")
		if err != nil {
			return nil, "", nil, fmt.Errorf("%w\nhint: %s", err, brokers.DynaliteHint)
		}
		if err := a.PingDynamoDB(ctx); err != nil {
			return nil, "", nil, err
		}
		s, err := a.DynamoStore(ctx, cfg.dynamoTable)
		if err != nil {
			return nil, "", nil, err
		}
		return s, fmt.Sprintf("DynamoDB table %s at %s", cfg.dynamoTable, a.Describe("dynamodb")), func() {}, nil
	}
	r, err := brokers.ConnectRedis(cfg.redisAddr)
	if err != nil {
		return nil, "", nil, err
	}
	s, err := r.Store(ctx, redisstore.Config{})
	if err != nil {
		r.Close()
		return nil, "", nil, err
	}
	about := r.Describe()
	if r.Embedded {
		about += " (set REDIS_ADDR to share records between processes)"
	}
	return s, about, r.Close, nil
}

func runWith(ctx context.Context, cfg config, k *brokers.Kafka, orders []publication, l *ledger, p *printer, out io.Writer) error {
	var logger watermill.LoggerAdapter = watermill.NopLogger{}
	if cfg.verbose {
		logger = watermill.NewStdLoggerWithOut(out, false, false)
	}
	ctx, cancelTimeout := context.WithTimeout(ctx, cfg.timeout)
	defer cancelTimeout()
	store, storeAbout, closeStore, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeStore()
	if err := k.CreateTopic(ctx, cfg.topic, int32(cfg.partitions)); err != nil {
		return err
	}
	pub, err := k.Publisher(nil, logger)
	if err != nil {
		return err
	}
	defer func() { _ = pub.Close() }()
	sub, err := k.Subscriber(cfg.group, logger)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s: topic %s, consumer group %s with %d members\nstore: %s\n", k.Describe(), cfg.topic, cfg.group, cfg.members, storeAbout)

	// One Deduplicator for every member: same store, key function and scope.
	d, err := dedup.New(dedup.Config{Store: store, Key: orderKey, Scope: cfg.scope, Observer: p, Logger: logger})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
	if err != nil {
		return err
	}
	acks := newAckCounter()
	router.AddMiddleware(acks.middleware)
	if cfg.idempotency {
		poison, err := middleware.PoisonQueueWithFilter(pub, cfg.topic+"-poison", dedup.IsPermanent)
		if err != nil {
			return err
		}
		router.AddMiddleware(poison, d.Middleware)
	}
	// Each handler subscribes once: one more member of the group.
	for i := range cfg.members {
		router.AddConsumerHandler(fmt.Sprintf("member-%d", i+1), cfg.topic, sub, l.charge)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(runCtx) }()
	select {
	case <-router.Running():
	case err := <-runErr:
		return err
	}
	defer func() { _ = router.Close() }()

	// Wait until every member owns partitions, so the demo shows the copies
	// of one order spread over members (the dedup does not need this).
	assignment, err := waitForMembers(ctx, k, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "group %s stable: partitions per member %v\n\n", cfg.group, assignment)

	if cfg.consume {
		fmt.Fprintln(out, "consuming; Ctrl-C to stop")
		select {
		case <-ctx.Done():
			return nil
		case err := <-runErr:
			return err
		}
	}

	published, distinct := map[string]bool{}, map[string]bool{}
	for _, o := range orders {
		if o.failFirst {
			l.mu.Lock()
			l.failOnce[o.order.OrderID] = true
			l.mu.Unlock()
		}
		for range o.copies {
			body := fmt.Sprintf(`{"order_id":%q,"amount":%d,"currency":%q}`, o.order.OrderID, o.order.Amount, o.order.Currency)
			msg := message.NewMessage(watermill.NewUUID(), []byte(body))
			if o.header {
				msg.Metadata.Set(orderHeader, o.order.OrderID)
			}
			if err := pub.Publish(cfg.topic, msg); err != nil {
				return fmt.Errorf("publishing %s: %w", o.order.OrderID, err)
			}
			published[msg.UUID] = true
		}
		distinct[o.order.OrderID] = true
		header := "without header"
		if o.header {
			header = "with header order_id"
		}
		fmt.Fprintf(out, "published %s x%d %s\n", o.order.OrderID, o.copies, header)
	}

	// Done when every message was acked and its offset committed (Sarama
	// commits marked offsets in the background; closing before the commit
	// would redeliver the last messages to the next consumer).
	if err := acks.wait(ctx, published); err != nil {
		return fmt.Errorf("waiting for %d acks: %w", len(published), err)
	}
	if err := waitCommitted(ctx, k, cfg); err != nil {
		return err
	}
	summary, charges := l.summary()
	fmt.Fprintf(out, "\n%d messages, %d distinct orders, %d charges: %s\n", len(published), len(distinct), charges, summary)
	fmt.Fprintf(out, "group %s: every offset committed\n", cfg.group)
	return nil
}

// waitForMembers polls the group until it is stable with cfg.members
// members (of this or other processes: at least cfg.members) that each own
// a partition of the topic.
func waitForMembers(ctx context.Context, k *brokers.Kafka, cfg config) ([][]int32, error) {
	want := min(cfg.members, cfg.partitions)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		state, members, err := k.GroupAssignment(cfg.group, cfg.topic)
		owners := 0
		for _, m := range members {
			if len(m) > 0 {
				owners++
			}
		}
		if err == nil && state == "Stable" && owners >= want {
			return members, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("consumer group %s not stable with %d members (state %q, %v, %v): %w", cfg.group, want, state, members, err, ctx.Err())
		case <-tick.C:
		}
	}
}

// waitCommitted polls the group's lag until every offset is committed.
func waitCommitted(ctx context.Context, k *brokers.Kafka, cfg config) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		lag, err := k.Lag(ctx, cfg.group, cfg.topic)
		if err == nil && lag == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("consumer group %s still has %d uncommitted messages (%v): %w", cfg.group, lag, err, ctx.Err())
		case <-tick.C:
		}
	}
}

// ackCounter records which messages the router acked.
type ackCounter struct {
	mu    sync.Mutex
	acked map[string]bool
	added chan struct{}
}

func newAckCounter() *ackCounter {
	return &ackCounter{acked: map[string]bool{}, added: make(chan struct{}, 1)}
}

func (c *ackCounter) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil {
			c.mu.Lock()
			c.acked[msg.UUID] = true
			c.mu.Unlock()
			select {
			case c.added <- struct{}{}:
			default:
			}
		}
		return out, err
	}
}

// wait returns once every message in uuids was acked.
func (c *ackCounter) wait(ctx context.Context, uuids map[string]bool) error {
	for {
		c.mu.Lock()
		missing := 0
		for id := range uuids {
			if !c.acked[id] {
				missing++
			}
		}
		c.mu.Unlock()
		if missing == 0 {
			return nil
		}
		select {
		case <-c.added:
		case <-ctx.Done():
			return fmt.Errorf("%d not acked: %w", missing, ctx.Err())
		}
	}
}
