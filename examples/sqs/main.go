// Command sqs is a "charge order" consumer on Amazon SQS, fed two ways: a
// queue that producers send orders to directly, and a queue subscribed to
// an SNS topic that orders are published to (fan-out). One Deduplicator,
// with one key function (the order id in the JSON body) and one scope,
// guards both: an order is charged once, whichever queue brings it and
// however many copies arrive, each with its own SQS MessageId.
//
//	AWS_ENDPOINT_URL=http://127.0.0.1:4566 go run ./examples/sqs             # local emulator, embedded Redis
//	AWS_ENDPOINT_URL=http://127.0.0.1:4566 go run ./examples/sqs -store dynamo
//	AWS_REGION=eu-west-1 REDIS_ADDR=my-redis:6379 go run ./examples/sqs     # AWS
//
// It uses watermill-aws v1.0.1 unchanged, with two adapters from
// internal/brokers: SNS Publish with TopicArn instead of TargetArn (local
// emulators need it; AWS accepts both), and a shorter redelivery delay for
// nacked messages (ChangeMessageVisibility). Endpoint, region and
// credentials come from the AWS SDK's standard environment. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
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
	store       string // redis or dynamo
	redisAddr   string // empty: embedded miniredis
	dynamoTable string
	queue       string // orders sent to SQS directly
	topic       string // orders published to SNS
	snsQueue    string // the queue subscribed to topic
	scope       string
	receivers   int
	idempotency bool
	consume     bool // consume until interrupted; publish nothing
	visibility  time.Duration
	retryAfter  time.Duration
	timeout     time.Duration
	verbose     bool
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("sqs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.store, "store", "redis", "dedup store: redis or dynamo")
	fs.StringVar(&c.redisAddr, "redis-addr", os.Getenv(brokers.RedisAddrEnv), "Redis server (default $REDIS_ADDR; empty: embedded miniredis)")
	fs.StringVar(&c.dynamoTable, "dynamo-table", "dedup-example", "DynamoDB table (created if missing)")
	fs.StringVar(&c.queue, "queue", "orders", "SQS queue producers send orders to")
	fs.StringVar(&c.topic, "topic", "order-events", "SNS topic orders are published to")
	fs.StringVar(&c.snsQueue, "sns-queue", "orders-from-sns", "SQS queue subscribed to the topic")
	fs.StringVar(&c.scope, "scope", "charge-order", "dedup scope shared by both handlers")
	fs.IntVar(&c.receivers, "receivers", 4, "receivers per queue (messages charged at once per queue)")
	fs.BoolVar(&c.idempotency, "idempotency", true, "deduplicate (false: charge every copy)")
	fs.BoolVar(&c.consume, "consume", false, "only consume, until interrupted; publish no demo orders")
	fs.DurationVar(&c.visibility, "visibility-timeout", 30*time.Second, "visibility timeout of the queues it creates")
	fs.DurationVar(&c.retryAfter, "retry-after", time.Second, "redeliver a nacked message after this long")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "give the demo up after this long")
	fs.BoolVar(&c.verbose, "v", false, "log Watermill's and the middleware's events")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.store != "redis" && c.store != "dynamo" {
		return c, fmt.Errorf("-store must be redis or dynamo, not %q", c.store)
	}
	if c.receivers < 1 {
		return c, errors.New("-receivers must be at least 1")
	}
	return c, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "sqs:", err)
		}
		return 2
	}
	if err := runConsumer(ctx, cfg, demoOrders, stdout); err != nil {
		fmt.Fprintln(stderr, "sqs:", err)
		var ue *brokers.UnreachableError
		if errors.As(err, &ue) {
			fmt.Fprintln(stderr, "hint:", ue.Hint)
		}
		return 1
	}
	return 0
}

// publication is one order sent to one entry point, copies times (a
// producer retrying, an event re-published): every copy is a new message.
type publication struct {
	via    string // "sqs" or "sns"
	order  order
	copies int
	// failFirst makes the first charge of the order fail (the payment
	// gateway times out), so the message is nacked and redelivered.
	failFirst bool
}

// demoOrders: 8 messages, 3 distinct orders. ORDER-003 arrives through both
// queues; the first charge of ORDER-004 fails and is retried.
var demoOrders = []publication{
	{via: "sqs", order: order{"ORDER-001", 100, "BRL"}, copies: 1},
	{via: "sqs", order: order{"ORDER-003", 150, "BRL"}, copies: 3},
	{via: "sns", order: order{"ORDER-003", 150, "BRL"}, copies: 2},
	{via: "sns", order: order{"ORDER-004", 80, "BRL"}, copies: 2, failFirst: true},
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

// runConsumer sets up the queues, the topic and the router, then publishes
// orders and waits until every message is acked and both queues are empty
// (or, with -consume, consumes until ctx ends).
func runConsumer(ctx context.Context, cfg config, orders []publication, out io.Writer) error {
	out = lockWriter(out)
	return runWith(ctx, cfg, orders, newLedger(out), newPrinter(out), out)
}

func runWith(ctx context.Context, cfg config, orders []publication, l *ledger, p *printer, out io.Writer) error {
	var logger watermill.LoggerAdapter = watermill.NopLogger{}
	if cfg.verbose {
		logger = watermill.NewStdLoggerWithOut(out, false, false)
	}
	a, err := brokers.LoadAWS(ctx, "sqs", "sns")
	if err != nil {
		return fmt.Errorf("%w\nhint: %s", err, brokers.FauxqsHint)
	}
	if err := a.PingSQS(ctx); err != nil {
		return err
	}
	if err := a.PingSNS(ctx); err != nil {
		return err
	}
	store, storeAbout, closeStore, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeStore()

	// The two entry points. The topic exists before the queue subscribes.
	opts := brokers.QueueOptions{VisibilityTimeout: cfg.visibility}
	sqsSub, queueURL, err := a.SQSSubscriber(ctx, cfg.queue, opts, logger)
	if err != nil {
		return err
	}
	topicArn, err := a.CreateTopic(ctx, cfg.topic)
	if err != nil {
		return err
	}
	snsSub, snsQueueURL, err := a.SNSSubscriber(ctx, topicArn, cfg.snsQueue, opts, logger)
	if err != nil {
		return err
	}
	sqsPub, err := a.SQSPublisher(logger)
	if err != nil {
		return err
	}
	snsPub, err := a.SNSPublisher(logger)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "SQS %s: queue %s; SNS topic %s → queue %s\nstore: %s\n\n", a.Describe("sqs"), cfg.queue, cfg.topic, cfg.snsQueue, storeAbout)

	// One Deduplicator for both handlers: same store, same key function,
	// same scope, so a copy arriving through the other queue is a duplicate
	// too.
	d, err := dedup.New(dedup.Config{Store: store, Key: orderKey, Scope: cfg.scope, Observer: p, Logger: logger})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
	if err != nil {
		return err
	}
	acks := newAckCounter()
	// Outermost: a nacked message comes back after -retry-after instead of
	// the whole visibility timeout.
	router.AddMiddleware(a.RetryAfter(cfg.retryAfter), acks.middleware)
	if cfg.idempotency {
		// Permanent errors (no order id, a reused key) go to a poison queue;
		// the rest (in progress, store down, a failed charge) are retried.
		poison, err := middleware.PoisonQueueWithFilter(sqsPub, cfg.queue+"-poison", dedup.IsPermanent)
		if err != nil {
			return err
		}
		router.AddMiddleware(poison, d.Middleware)
	}
	for i := range cfg.receivers {
		router.AddConsumerHandler(fmt.Sprintf("charge-orders-sqs-%d", i+1), cfg.queue, sqsSub, l.charge("sqs"))
		router.AddConsumerHandler(fmt.Sprintf("charge-orders-sns-%d", i+1), topicArn, snsSub, l.charge("sns"))
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

	if cfg.consume {
		fmt.Fprintln(out, "consuming; Ctrl-C to stop")
		select {
		case <-ctx.Done():
			return nil
		case err := <-runErr:
			return err
		}
	}

	ctx, cancelTimeout := context.WithTimeout(ctx, cfg.timeout)
	defer cancelTimeout()
	published, distinct := map[string]bool{}, map[string]bool{}
	for _, pub := range orders {
		if pub.failFirst {
			l.mu.Lock()
			l.failOnce[pub.order.OrderID] = true
			l.mu.Unlock()
		}
		for range pub.copies {
			body := fmt.Sprintf(`{"order_id":%q,"amount":%d,"currency":%q}`, pub.order.OrderID, pub.order.Amount, pub.order.Currency)
			msg := message.NewMessage(watermill.NewUUID(), []byte(body))
			if pub.via == "sns" {
				err = snsPub.Publish(topicArn, msg)
			} else {
				err = sqsPub.Publish(cfg.queue, msg)
			}
			if err != nil {
				return fmt.Errorf("publishing %s: %w", pub.order.OrderID, err)
			}
			published[msg.UUID] = true
		}
		distinct[pub.order.OrderID] = true
		where := "queue " + cfg.queue
		if pub.via == "sns" {
			where = "topic " + cfg.topic
		}
		copies := "1 copy"
		if pub.copies != 1 {
			copies = fmt.Sprintf("%d copies", pub.copies)
		}
		fmt.Fprintf(out, "published %s to %s (%s)\n", pub.order.OrderID, where, copies)
	}

	// Done when every message was acked and SQS holds none of them any more
	// (the acks are DeleteMessage calls, made after the handler returns).
	if err := acks.wait(ctx, published); err != nil {
		return fmt.Errorf("waiting for %d acks: %w", len(published), err)
	}
	for _, url := range []string{queueURL, snsQueueURL} {
		if err := waitEmpty(ctx, a, url); err != nil {
			return err
		}
	}
	summary, charges := l.summary()
	fmt.Fprintf(out, "\n%d messages, %d distinct orders, %d charges: %s\n", len(published), len(distinct), charges, summary)
	fmt.Fprintf(out, "queues %s and %s: no message waiting or in flight\n", cfg.queue, cfg.snsQueue)
	return nil
}

// ackCounter records which messages (by UUID) the router acked.
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

// waitEmpty waits until the queue has no message waiting, in flight or
// delayed.
func waitEmpty(ctx context.Context, a *brokers.AWS, url string) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		visible, inFlight, delayed, err := a.QueueDepth(ctx, url)
		if err == nil && visible+inFlight+delayed == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("queue %s not empty (%d waiting, %d in flight, %d delayed; %v): %w",
				url[strings.LastIndexByte(url, '/')+1:], visible, inFlight, delayed, err, ctx.Err())
		case <-tick.C:
		}
	}
}
