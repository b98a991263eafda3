// Command kafka is the "charge order" consumer on Kafka: watermill-kafka/v3
// (Sarama) in a consumer group whose members share one Deduplicator, so
// each order is charged once however many copies are produced and
// whichever partition and member they land on. The key is the order id,
// taken from a Kafka header when the producer set one and from the JSON
// body otherwise.
//
//	go run ./examples/kafka                                 # embedded Kafka (kfake) and Redis (miniredis)
//	KAFKA_BROKERS=broker1:9092 REDIS_ADDR=my-redis:6379 go run ./examples/kafka
//
// Without KAFKA_BROKERS it starts an in-process Kafka-protocol cluster, and
// without REDIS_ADDR an in-process Redis, so it runs with no setup. The
// folder imports nothing internal to this module: copy it out and it
// builds. See README.md.
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
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// config is the command line.
type config struct {
	kafkaBrokers string // empty: embedded kfake
	redisAddr    string // empty: embedded miniredis
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
	fs.StringVar(&c.kafkaBrokers, "kafka-brokers", os.Getenv("KAFKA_BROKERS"), "Kafka bootstrap brokers, comma-separated (default $KAFKA_BROKERS; empty: embedded kfake cluster)")
	fs.StringVar(&c.redisAddr, "redis-addr", os.Getenv("REDIS_ADDR"), "Redis server, host:port or redis:// URL (default $REDIS_ADDR; empty: embedded miniredis)")
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
	k, err := connectKafka(cfg.kafkaBrokers)
	if err != nil {
		fmt.Fprintln(stderr, "kafka:", err)
		return 1
	}
	defer k.close()
	if err := runWith(ctx, cfg, k, demoOrders, newLedger(out), newPrinter(out), out); err != nil {
		fmt.Fprintln(stderr, "kafka:", err)
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

func runWith(ctx context.Context, cfg config, k *cluster, orders []publication, l *ledger, p *printer, out io.Writer) error {
	var logger watermill.LoggerAdapter = watermill.NopLogger{}
	if cfg.verbose {
		logger = watermill.NewStdLoggerWithOut(out, false, false)
	}
	ctx, cancelTimeout := context.WithTimeout(ctx, cfg.timeout)
	defer cancelTimeout()
	store, storeAbout, closeStore, err := openStore(ctx, cfg.redisAddr)
	if err != nil {
		return err
	}
	defer closeStore()
	if err := k.createTopic(cfg.topic, int32(cfg.partitions)); err != nil {
		return err
	}
	pub, err := k.publisher(logger)
	if err != nil {
		return err
	}
	defer func() { _ = pub.Close() }()
	fmt.Fprintf(out, "%s: topic %s, consumer group %s with %d members\nstore: %s\n", k.describe(), cfg.topic, cfg.group, cfg.members, storeAbout)

	acks := newAckCounter()
	router, err := newRouter(cfg, k, pub, store, acks, l, p, logger)
	if err != nil {
		return err
	}
	runErr, err := startRouter(ctx, router)
	if err != nil {
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

	published, distinct, err := publishOrders(cfg, pub, orders, l, out)
	if err != nil {
		return err
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
	fmt.Fprintf(out, "\n%d messages, %d distinct orders, %d charges: %s\n", len(published), distinct, charges, summary)
	fmt.Fprintf(out, "group %s: every offset committed\n", cfg.group)
	return nil
}

// newRouter builds the consumer group: cfg.members handlers, each one more
// member of the group (each Subscribe call joins it), all behind one
// Deduplicator (same store, key function and scope).
func newRouter(cfg config, k *cluster, pub message.Publisher, store dedup.Store, acks *ackCounter, l *ledger, p *printer, logger watermill.LoggerAdapter) (*message.Router, error) {
	d, err := dedup.New(dedup.Config{Store: store, Key: orderKey, Scope: cfg.scope, Observer: p, Logger: logger})
	if err != nil {
		return nil, err
	}
	sub, err := k.subscriber(cfg.group, logger)
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
	if err != nil {
		return nil, err
	}
	router.AddMiddleware(acks.middleware)
	if cfg.idempotency {
		poison, err := middleware.PoisonQueueWithFilter(pub, cfg.topic+"-poison", dedup.IsPermanent)
		if err != nil {
			return nil, err
		}
		router.AddMiddleware(poison, d.Middleware)
	}
	for i := range cfg.members {
		router.AddConsumerHandler(fmt.Sprintf("member-%d", i+1), cfg.topic, sub, l.charge)
	}
	return router, nil
}

// startRouter runs the router until ctx ends and returns once it is
// running; the channel receives what Run returned.
func startRouter(ctx context.Context, router *message.Router) (<-chan error, error) {
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	select {
	case <-router.Running():
		return runErr, nil
	case err := <-runErr:
		return nil, err
	}
}

// publishOrders produces each publication's copies, each a new record with
// a new UUID, and returns the UUIDs sent and the number of distinct orders.
func publishOrders(cfg config, pub message.Publisher, orders []publication, l *ledger, out io.Writer) (map[string]bool, int, error) {
	published, distinct := map[string]bool{}, map[string]bool{}
	for _, o := range orders {
		if o.failFirst {
			l.failFirst(o.order.OrderID)
		}
		for range o.copies {
			body := fmt.Sprintf(`{"order_id":%q,"amount":%d,"currency":%q}`, o.order.OrderID, o.order.Amount, o.order.Currency)
			msg := message.NewMessage(watermill.NewUUID(), []byte(body))
			if o.header {
				msg.Metadata.Set(orderHeader, o.order.OrderID)
			}
			if err := pub.Publish(cfg.topic, msg); err != nil {
				return nil, 0, fmt.Errorf("publishing %s: %w", o.order.OrderID, err)
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
	return published, len(distinct), nil
}

// waitForMembers polls the group until it is stable with cfg.members
// members (of this or other processes: at least cfg.members) that each own
// a partition of the topic.
func waitForMembers(ctx context.Context, k *cluster, cfg config) ([][]int32, error) {
	want := min(cfg.members, cfg.partitions)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		state, members, err := k.assignment(cfg.group, cfg.topic)
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
func waitCommitted(ctx context.Context, k *cluster, cfg config) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		lag, err := k.lag(ctx, cfg.group, cfg.topic)
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
