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
// It uses watermill-aws v1.0.1 unchanged, with three small adapters in
// aws.go: SNS Publish with TopicArn instead of TargetArn (local emulators
// need it; AWS accepts both), the SQS MessageId on received messages, and a
// shorter redelivery delay for nacked messages (ChangeMessageVisibility).
// Endpoint, region and credentials come from the AWS SDK's standard
// environment. The folder imports nothing internal to this module: copy it
// out and it builds. See README.md.
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

	wsns "github.com/ThreeDotsLabs/watermill-aws/sns"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/watermill-dedup/watermill-dedup/dedup"
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
	fs.StringVar(&c.redisAddr, "redis-addr", os.Getenv("REDIS_ADDR"), "Redis server (default $REDIS_ADDR; empty: embedded miniredis)")
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
		var he *hintError
		if errors.As(err, &he) {
			fmt.Fprintln(stderr, "hint:", he.hint)
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
	awsCfg, err := loadAWS(ctx, "sqs", "sns")
	if err != nil {
		return &hintError{err, fauxqsHint}
	}
	if err := pingSQS(ctx, awsCfg); err != nil {
		return err
	}
	store, storeAbout, closeStore, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeStore()
	ep, err := openEntryPoints(ctx, awsCfg, cfg, logger)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "SQS %s: queue %s; SNS topic %s → queue %s\nstore: %s\n\n", where(awsCfg, "sqs"), cfg.queue, cfg.topic, cfg.snsQueue, storeAbout)

	acks := newAckCounter()
	router, err := newRouter(cfg, ep, store, acks, l, p, logger)
	if err != nil {
		return err
	}
	runErr, err := startRouter(ctx, router)
	if err != nil {
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
	published, distinct, err := publishOrders(cfg, ep, orders, l, out)
	if err != nil {
		return err
	}
	if err := waitDone(ctx, ep, acks, published); err != nil {
		return err
	}
	summary, charges := l.summary()
	fmt.Fprintf(out, "\n%d messages, %d distinct orders, %d charges: %s\n", len(published), distinct, charges, summary)
	fmt.Fprintf(out, "queues %s and %s: no message waiting or in flight\n", cfg.queue, cfg.snsQueue)
	return nil
}

// entryPoints are the two ways orders arrive: the queue producers send to,
// and the topic whose subscribed queue the consumer reads.
type entryPoints struct {
	sqs         *sqs.Client
	sqsSub      *wsqs.Subscriber
	sqsPub      *wsqs.Publisher
	queueURL    string
	topicArn    string
	snsSub      *wsns.Subscriber
	snsPub      *wsns.Publisher
	snsQueueURL string
}

// openEntryPoints creates the queue, the topic (before the queue that
// subscribes to it) and the publishers and subscribers.
func openEntryPoints(ctx context.Context, awsCfg aws.Config, cfg config, logger watermill.LoggerAdapter) (*entryPoints, error) {
	ep := &entryPoints{sqs: sqs.NewFromConfig(awsCfg)}
	var err error
	if ep.queueURL, err = createQueue(ctx, ep.sqs, cfg.queue, cfg.visibility); err != nil {
		return nil, err
	}
	if ep.sqsSub, err = wsqs.NewSubscriber(subscriberConfig(awsCfg, ep.queueURL, cfg.visibility), logger); err != nil {
		return nil, err
	}
	topic, err := sns.NewFromConfig(awsCfg).CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(cfg.topic)})
	if err != nil {
		return nil, fmt.Errorf("creating SNS topic %q: %w", cfg.topic, err)
	}
	ep.topicArn = aws.ToString(topic.TopicArn)
	if ep.snsSub, ep.snsQueueURL, err = snsSubscriber(ctx, awsCfg, ep.topicArn, cfg.snsQueue, cfg.visibility, logger); err != nil {
		return nil, err
	}
	if ep.sqsPub, err = wsqs.NewPublisher(wsqs.PublisherConfig{AWSConfig: awsCfg}, logger); err != nil {
		return nil, err
	}
	ep.snsPub, err = wsns.NewPublisher(wsns.PublisherConfig{
		AWSConfig:                   awsCfg,
		TopicResolver:               wsns.TransparentTopicResolver{},
		Marshaler:                   topicArnMarshaler{},
		DoNotCreateTopicIfNotExists: true,
	}, logger)
	return ep, err
}

// newRouter builds the consumer: cfg.receivers handlers per queue, all
// behind one Deduplicator (same store, key function and scope), so a copy
// arriving through the other queue is a duplicate too.
func newRouter(cfg config, ep *entryPoints, store dedup.Store, acks *ackCounter, l *ledger, p *printer, logger watermill.LoggerAdapter) (*message.Router, error) {
	d, err := dedup.New(dedup.Config{Store: store, Key: orderKey, Scope: cfg.scope, Observer: p, Logger: logger})
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
	if err != nil {
		return nil, err
	}
	// Outermost: a nacked message comes back after -retry-after instead of
	// the whole visibility timeout.
	router.AddMiddleware(retryAfter(ep.sqs, cfg.retryAfter), acks.middleware)
	if cfg.idempotency {
		// Permanent errors (no order id, a reused key) go to a poison queue;
		// the rest (in progress, store down, a failed charge) are retried.
		poison, err := middleware.PoisonQueueWithFilter(ep.sqsPub, cfg.queue+"-poison", dedup.IsPermanent)
		if err != nil {
			return nil, err
		}
		router.AddMiddleware(poison, d.Middleware)
	}
	for i := range cfg.receivers {
		router.AddConsumerHandler(fmt.Sprintf("charge-orders-sqs-%d", i+1), cfg.queue, ep.sqsSub, l.charge("sqs"))
		router.AddConsumerHandler(fmt.Sprintf("charge-orders-sns-%d", i+1), ep.topicArn, ep.snsSub, l.charge("sns"))
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

// publishOrders sends each publication's copies to its entry point, each
// copy a new message, and returns the UUIDs sent and the number of
// distinct orders.
func publishOrders(cfg config, ep *entryPoints, orders []publication, l *ledger, out io.Writer) (map[string]bool, int, error) {
	published, distinct := map[string]bool{}, map[string]bool{}
	for _, pub := range orders {
		if pub.failFirst {
			l.failFirst(pub.order.OrderID)
		}
		for range pub.copies {
			body := fmt.Sprintf(`{"order_id":%q,"amount":%d,"currency":%q}`, pub.order.OrderID, pub.order.Amount, pub.order.Currency)
			msg := message.NewMessage(watermill.NewUUID(), []byte(body))
			var err error
			if pub.via == "sns" {
				err = ep.snsPub.Publish(ep.topicArn, msg)
			} else {
				err = ep.sqsPub.Publish(cfg.queue, msg)
			}
			if err != nil {
				return nil, 0, fmt.Errorf("publishing %s: %w", pub.order.OrderID, err)
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
	return published, len(distinct), nil
}

// waitDone returns once every message was acked and SQS holds none of
// them any more (the acks are DeleteMessage calls, made after the handler
// returns).
func waitDone(ctx context.Context, ep *entryPoints, acks *ackCounter, published map[string]bool) error {
	if err := acks.wait(ctx, published); err != nil {
		return fmt.Errorf("waiting for %d acks: %w", len(published), err)
	}
	for _, u := range []string{ep.queueURL, ep.snsQueueURL} {
		if err := waitEmpty(ctx, ep.sqs, u); err != nil {
			return err
		}
	}
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
func waitEmpty(ctx context.Context, client *sqs.Client, queueURL string) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		n, err := queueDepth(ctx, client, queueURL)
		if err == nil && n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("queue %s not empty (%d messages; %v): %w", queueURL[strings.LastIndexByte(queueURL, '/')+1:], n, err, ctx.Err())
		case <-tick.C:
		}
	}
}
