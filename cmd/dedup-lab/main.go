// Command dedup-lab runs the ORDER-003 lab: ten copies of one order (each
// with its own message id) plus other orders with random duplicates, through
// a Watermill router, with idempotency off and then on, and prints what was
// charged.
//
//	go run ./cmd/dedup-lab
//	go run ./cmd/dedup-lab -broker kafka -store redis
//	AWS_ENDPOINT_URL=http://127.0.0.1:4566 go run ./cmd/dedup-lab -broker sns -store dynamo
//	go run ./cmd/dedup-lab -runtime lambda
//
// -runtime lambda consumes the orders in AWS Lambda's shape instead of a
// router: SQS records in batches of up to 10, -concurrency invocations at
// once, through lambdadedup's handler (idempotency on) or a plain batch
// handler (off), all in process (no broker: -broker must stay gochannel).
//
// It needs no server by default: Watermill's in-process GoChannel and the
// in-memory store. -broker kafka starts an in-process Kafka-protocol
// cluster (kfake) unless KAFKA_BROKERS names real brokers; -store redis
// starts an in-process miniredis unless REDIS_ADDR names a server; -broker
// sqs|sns and -store dynamo use the AWS SDK's standard configuration
// (AWS_ENDPOINT_URL for a local emulator, or AWS_REGION and credentials for
// AWS) and print how to start the local emulator when none answers. See
// README.md.
//
// It exits with status 1 when a run does not show what it should (off:
// charges == messages plus lost acks; on: charges == distinct orders; every
// message acked and none left in the broker), and with status 2 on bad
// flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/watermill-dedup/internal/kafkabroker"
	"github.com/watermill-dedup/watermill-dedup/internal/lab"
	"github.com/watermill-dedup/watermill-dedup/internal/redisaddr"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dedup-lab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		copies      = fs.Int("copies", 10, "how many times ORDER-003 is published")
		orders      = fs.Int("orders", 100, "how many other orders are published")
		maxDup      = fs.Int("max-duplicates", 3, "each other order is published 1..N times")
		concurrency = fs.Int("concurrency", 8, "handler calls running at once")
		idem        = fs.String("idempotency", "both", "on, off or both")
		seed        = fs.Uint64("seed", 1, "random seed for duplicates and their order")
		effect      = fs.Duration("effect-time", 2*time.Millisecond, "how long one charge takes")
		timeout     = fs.Duration("timeout", 2*time.Minute, "give up a run after this long")
		loseAcks    = fs.Int("lose-acks", 0, "lose the first ack of N messages (nack after the charge) so the broker redelivers them")
		brokerName  = fs.String("broker", "gochannel", "broker: "+strings.Join(names(brokerNames), ", "))
		storeName   = fs.String("store", "memory", "store: "+strings.Join(names(storeNames), ", "))
		kafkaAddrs  = fs.String("kafka-brokers", os.Getenv(kafkabroker.Env), "Kafka bootstrap brokers, comma-separated (default $KAFKA_BROKERS; empty: embedded kfake cluster)")
		redisAddr   = fs.String("redis-addr", os.Getenv(redisaddr.Env), "Redis server: host:port, redis:// or rediss:// URL, or comma-separated Cluster nodes (default $REDIS_ADDR; empty: embedded miniredis)")
		dynamoTable = fs.String("dynamo-table", "dedup-lab", "DynamoDB table (created if missing)")
		verbose     = fs.Bool("v", false, "log Watermill's and the middleware's events to stderr")
		runtimeName = fs.String("runtime", "router", "consumer runtime: router (a Watermill router on -broker) or lambda (SQS batches through lambdadedup, in process)")
	)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: dedup-lab [flags]\n\nPublishes ORDER-003 -copies times plus -orders other orders with random duplicates,\nconsumes them with idempotency off and on, and prints the charges.\n\n")
		fs.PrintDefaults()
		fmt.Fprintf(fs.Output(), "\nSQS, SNS and DynamoDB use the AWS SDK's environment: AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_SQS,\n_SNS, _DYNAMODB) for a local emulator, AWS_REGION and credentials for AWS.\n")
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	off, on := false, false
	switch *idem {
	case "on":
		on = true
	case "off":
		off = true
	case "both":
		off, on = true, true
	default:
		fmt.Fprintf(stderr, "dedup-lab: -idempotency must be on, off or both, not %q\n", *idem)
		return 2
	}
	if *copies < 1 || *orders < 0 || *maxDup < 1 || *concurrency < 1 || *loseAcks < 0 {
		fmt.Fprintln(stderr, "dedup-lab: -copies, -max-duplicates and -concurrency must be at least 1, -orders and -lose-acks at least 0")
		return 2
	}
	lambdaRuntime := *runtimeName == "lambda"
	if !lambdaRuntime && *runtimeName != "router" {
		fmt.Fprintf(stderr, "dedup-lab: -runtime must be router or lambda, not %q\n", *runtimeName)
		return 2
	}
	if lambdaRuntime && (*brokerName != "gochannel" || *loseAcks != 0) {
		fmt.Fprintln(stderr, "dedup-lab: -runtime lambda simulates SQS in process: it takes no -broker and no -lose-acks")
		return 2
	}
	newBroker, ok := brokerNames[*brokerName]
	if !ok {
		fmt.Fprintf(stderr, "dedup-lab: unknown -broker %q (have %s)\n", *brokerName, strings.Join(names(brokerNames), ", "))
		return 2
	}
	newStore, ok := storeNames[*storeName]
	if !ok {
		fmt.Fprintf(stderr, "dedup-lab: unknown -store %q (have %s)\n", *storeName, strings.Join(names(storeNames), ", "))
		return 2
	}
	var logger watermill.LoggerAdapter = watermill.NopLogger{}
	if *verbose {
		logger = watermill.NewStdLoggerWithOut(stderr, false, false)
	}
	opts := options{concurrency: *concurrency, kafkaBrokers: *kafkaAddrs, dynamoTable: *dynamoTable, logger: logger, redis: &sharedRedis{addr: *redisAddr}}
	defer opts.redis.close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	cfg := lab.Config{
		Copies: *copies, Orders: *orders, MaxDuplicates: *maxDup, Concurrency: *concurrency,
		EffectTime: *effect, Seed: *seed, Timeout: *timeout, Progress: stderr,
		LoseAcks: *loseAcks, Broker: *brokerName, StoreName: *storeName, Logger: logger,
	}
	broker, err := newBroker(ctx, opts)
	if err != nil {
		return setupFailed(stderr, "broker "+*brokerName, err)
	}
	defer broker.close()
	store, err := newStore(ctx, opts)
	if err != nil {
		return setupFailed(stderr, "store "+*storeName, err)
	}
	defer store.close()
	cfg.NewTransport = broker.transport
	cfg.NewStore = store.store

	if lambdaRuntime {
		fmt.Fprintf(stdout, "dedup-lab: ORDER-003 x%d + %d other orders (1-%d copies each), runtime lambda (SQS batches of up to %d, %d invocations at once), store %s\n",
			*copies, *orders, *maxDup, lab.LambdaBatchSize, *concurrency, *storeName)
	} else {
		fmt.Fprintf(stdout, "dedup-lab: ORDER-003 x%d + %d other orders (1-%d copies each), broker %s, store %s, concurrency %d\n",
			*copies, *orders, *maxDup, *brokerName, *storeName, *concurrency)
	}
	if broker.about != "" {
		fmt.Fprintf(stdout, "  broker: %s\n", broker.about)
	}
	if store.about != "" {
		fmt.Fprintf(stdout, "  store:  %s\n", store.about)
	}
	if *loseAcks > 0 {
		fmt.Fprintf(stdout, "  lost acks: the first delivery of %d messages is nacked after its charge, so the broker redelivers it\n", *loseAcks)
	}
	fmt.Fprintln(stdout)
	runLab := lab.Run
	if lambdaRuntime {
		runLab = lab.RunLambda
	}
	results, err := runLab(ctx, cfg, off, on)
	lab.PrintTable(stdout, results)
	if err != nil {
		fmt.Fprintf(stderr, "dedup-lab: %v\n", err)
		return 1
	}
	status := 0
	fmt.Fprintln(stdout)
	for _, r := range results {
		again := ""
		if r.LostAcks > 0 {
			again = fmt.Sprintf(" (+%d redelivered after a lost ack)", r.LostAcks)
		}
		switch {
		case !r.OK():
			fmt.Fprintf(stdout, "FAIL idempotency %s: %d charges for %d messages%s of %d orders, %d acked, %d left in the broker\n",
				onOff(r.Idempotency), r.Charges, r.Messages, again, r.DistinctOrders, r.Acked, r.Pending)
			status = 1
		case r.Idempotency:
			fmt.Fprintf(stdout, "idempotency on:  %d charges for %d distinct orders: every order charged exactly once (%.2fs)\n", r.Charges, r.DistinctOrders, r.Elapsed.Seconds())
		default:
			fmt.Fprintf(stdout, "idempotency off: %d charges for %d messages%s: every copy charged again (%.2fs)\n", r.Charges, r.Messages, again, r.Elapsed.Seconds())
		}
	}
	if broker.about != "" && status == 0 {
		fmt.Fprintln(stdout, "broker: every message acked, none left waiting, in flight or uncommitted")
	}
	return status
}

// setupFailed reports a backend that could not be set up, with the hint on
// starting a local one when there is one, and returns the exit status.
func setupFailed(stderr io.Writer, what string, err error) int {
	fmt.Fprintf(stderr, "dedup-lab: %s: %v\n", what, err)
	var se *setupError
	if errors.As(err, &se) && se.hint != "" {
		fmt.Fprintf(stderr, "hint: %s\n", se.hint)
	}
	return 1
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func names[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
