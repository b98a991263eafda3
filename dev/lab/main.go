// Command dedup-lab runs the ORDER-003 lab: ten copies of one order (each
// with its own message id) plus other orders with random duplicates, through
// a Watermill router, with idempotency off and then on, and prints what was
// charged.
//
//	go run ./dev/lab
//	go run ./dev/lab -broker kafka -store redis
//	AWS_ENDPOINT_URL=http://127.0.0.1:4566 go run ./dev/lab -broker sns -store dynamo
//	go run ./dev/lab -runtime lambda
//	go run ./dev/lab -store redis -effect-in-tx
//
// -effect-in-tx writes each charge of the idempotent run to the store's own
// database (a Redis key, a DynamoDB charges table) in the same atomic step
// that completes the order's record (the store's TxMiddleware), and prints
// that table.
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

	"github.com/watermill-dedup/watermill-dedup/cmd/dedupctl/env/redisaddr"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/kafkabroker"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/lab"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// flags is the parsed command line.
type flags struct {
	copies, orders, maxDup, concurrency, loseAcks int
	off, on, shadow, effectInTx                   bool
	seed                                          uint64
	effect, timeout                               time.Duration
	broker, store, runtime                        string
	kafkaBrokers, redisAddr, natsURL, amqpURL     string
	dynamoTable                                   string
	verbose                                       bool
}

// errUsagePrinted: the flag package has printed the problem and the usage.
var errUsagePrinted = errors.New("usage printed")

// errHelp: -h asked for the usage, which the flag package has printed.
var errHelp = errors.New("help printed")

// parseFlags parses args.
func parseFlags(args []string, stderr io.Writer) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("dedup-lab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	idem := fs.String("idempotency", "both", "on, off, both, or shadow (dedup.Config.Shadow: every copy charged, the ones dedup would skip counted)")
	fs.IntVar(&f.copies, "copies", 10, "how many times ORDER-003 is published")
	fs.IntVar(&f.orders, "orders", 100, "how many other orders are published")
	fs.IntVar(&f.maxDup, "max-duplicates", 3, "each other order is published 1..N times")
	fs.IntVar(&f.concurrency, "concurrency", 8, "handler calls running at once (SQS/SNS receivers, group members, consumers)")
	fs.Uint64Var(&f.seed, "seed", 1, "random seed for duplicates and their order")
	fs.DurationVar(&f.effect, "effect-time", 2*time.Millisecond, "how long one charge takes")
	fs.DurationVar(&f.timeout, "timeout", 2*time.Minute, "give up a run after this long")
	fs.IntVar(&f.loseAcks, "lose-acks", 0, "lose the first ack of N messages (nack after the charge) so the broker redelivers them")
	fs.StringVar(&f.broker, "broker", "gochannel", "broker: "+strings.Join(names(brokerNames), ", "))
	fs.StringVar(&f.store, "store", "memory", "store: "+strings.Join(names(storeNames), ", "))
	fs.StringVar(&f.kafkaBrokers, "kafka-brokers", os.Getenv(kafkabroker.Env), "Kafka bootstrap brokers, comma-separated (default $KAFKA_BROKERS; empty: embedded kfake cluster)")
	fs.StringVar(&f.redisAddr, "redis-addr", os.Getenv(redisaddr.Env), "Redis server of -store redis and -broker redisstream: host:port, redis:// or rediss:// URL, or comma-separated Cluster nodes (default $REDIS_ADDR; empty: embedded miniredis)")
	fs.StringVar(&f.natsURL, "nats-url", os.Getenv("NATS_URL"), "NATS server with JetStream (default $NATS_URL; empty: embedded nats-server)")
	fs.StringVar(&f.amqpURL, "amqp-url", os.Getenv("AMQP_URL"), "RabbitMQ, amqp://user:password@host:port/ (default $AMQP_URL; required for -broker amqp)")
	fs.StringVar(&f.dynamoTable, "dynamo-table", "dedup-lab", "DynamoDB table (created if missing)")
	fs.BoolVar(&f.verbose, "v", false, "log Watermill's and the middleware's events to stderr")
	fs.BoolVar(&f.effectInTx, "effect-in-tx", false, "with idempotency on, write each charge to the store's own charges table in the transaction that completes the order's record (-store redis or dynamo; DynamoDB needs TransactWriteItems, which dynalite lacks: use moto_server), and print that table")
	fs.StringVar(&f.runtime, "runtime", "router", "consumer runtime: router (a Watermill router on -broker) or lambda (SQS batches through lambdadedup, in process)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: dedup-lab [flags]\n\nPublishes ORDER-003 -copies times plus -orders other orders with random duplicates,\nconsumes them with idempotency off and on, and prints the charges.\n\n")
		fs.PrintDefaults()
		fmt.Fprintf(fs.Output(), "\nSQS, SNS and DynamoDB use the AWS SDK's environment: AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_SQS,\n_SNS, _DYNAMODB) for a local emulator, AWS_REGION and credentials for AWS.\n"+
			"-broker redisstream uses the Redis of -store redis (one server for both). -broker amqp needs a RabbitMQ:\n%s.\n", amqpHint)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return f, errHelp
		}
		return f, errUsagePrinted
	}
	switch *idem {
	case "on":
		f.on = true
	case "off":
		f.off = true
	case "both":
		f.off, f.on = true, true
	case "shadow":
		f.on, f.shadow = true, true
	default:
		return f, fmt.Errorf("-idempotency must be on, off, both or shadow, not %q", *idem)
	}
	return f, f.check()
}

// check reports a flag combination the lab cannot run.
func (f flags) check() error {
	if f.copies < 1 || f.orders < 0 || f.maxDup < 1 || f.concurrency < 1 || f.loseAcks < 0 {
		return errors.New("-copies, -max-duplicates and -concurrency must be at least 1, -orders and -lose-acks at least 0")
	}
	if f.runtime != "router" && f.runtime != "lambda" {
		return fmt.Errorf("-runtime must be router or lambda, not %q", f.runtime)
	}
	if f.runtime == "lambda" && (f.broker != "gochannel" || f.loseAcks != 0) {
		return errors.New("-runtime lambda simulates SQS in process: it takes no -broker and no -lose-acks")
	}
	if _, ok := brokerNames[f.broker]; !ok {
		return fmt.Errorf("unknown -broker %q (have %s)", f.broker, strings.Join(names(brokerNames), ", "))
	}
	if _, ok := storeNames[f.store]; !ok {
		return fmt.Errorf("unknown -store %q (have %s)", f.store, strings.Join(names(storeNames), ", "))
	}
	if f.effectInTx && (f.store == "memory" || f.runtime != "router" || f.shadow) {
		return errors.New("-effect-in-tx needs -store redis or dynamo, -runtime router and no -idempotency shadow (a shadow run has no claim to complete)")
	}
	return nil
}

func run(args []string, stdout, stderr io.Writer) int {
	f, err := parseFlags(args, stderr)
	if errors.Is(err, errHelp) {
		return 0
	}
	if err != nil {
		if !errors.Is(err, errUsagePrinted) {
			fmt.Fprintf(stderr, "dedup-lab: %v\n", err)
		}
		return 2
	}
	var logger watermill.LoggerAdapter = watermill.NopLogger{}
	if f.verbose {
		logger = watermill.NewStdLoggerWithOut(stderr, false, false)
	}
	opts := options{
		concurrency: f.concurrency, kafkaBrokers: f.kafkaBrokers, natsURL: f.natsURL, amqpURL: f.amqpURL,
		dynamoTable: f.dynamoTable, logger: logger, redis: &sharedRedis{addr: f.redisAddr},
	}
	defer opts.redis.close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	broker, err := brokerNames[f.broker](ctx, opts)
	if err != nil {
		return setupFailed(stderr, "broker "+f.broker, err)
	}
	defer broker.close()
	store, err := storeNames[f.store](ctx, opts)
	if err != nil {
		return setupFailed(stderr, "store "+f.store, err)
	}
	defer store.close()
	var txCharges lab.TxCharges
	if f.effectInTx {
		if txCharges, err = store.txCharges(ctx); err != nil {
			return setupFailed(stderr, "store "+f.store+" -effect-in-tx", err)
		}
	}

	printHeader(stdout, f, broker, store)
	cfg := lab.Config{
		Copies: f.copies, Orders: f.orders, MaxDuplicates: f.maxDup, Concurrency: f.concurrency,
		EffectTime: f.effect, Seed: f.seed, Timeout: f.timeout, Progress: stderr,
		LoseAcks: f.loseAcks, Broker: f.broker, StoreName: f.store, Logger: logger, Shadow: f.shadow,
		NewTransport: broker.transport, NewStore: store.store, TxCharges: txCharges,
	}
	runLab := lab.Run
	if f.runtime == "lambda" {
		runLab = lab.RunLambda
	}
	results, err := runLab(ctx, cfg, f.off, f.on)
	lab.PrintTable(stdout, results)
	if cfg.TxCharges != nil {
		lab.PrintCharges(stdout, cfg.TxCharges.Where(), results)
	}
	if err != nil {
		fmt.Fprintf(stderr, "dedup-lab: %v\n", err)
		return 1
	}
	status := printVerdicts(stdout, results)
	if broker.about != "" && status == 0 {
		fmt.Fprintln(stdout, "broker: every message acked, none left waiting, in flight or uncommitted")
	}
	printLeftovers(stdout, store, results)
	return status
}

// printLeftovers says what the idempotent runs left in a store that
// outlives the process: one record per distinct order, under the run's
// scope, kept for the lab's retention.
func printLeftovers(stdout io.Writer, store *store, results []lab.Result) {
	if store.leaves == nil {
		return
	}
	for _, r := range results {
		if r.Idempotency && r.Scope != "" {
			fmt.Fprintf(stdout, "left in the store: %s\n", store.leaves(r.Scope, r.DistinctOrders))
		}
	}
}

// printHeader says what runs where.
func printHeader(stdout io.Writer, f flags, broker *broker, store *store) {
	if f.runtime == "lambda" {
		fmt.Fprintf(stdout, "dedup-lab: ORDER-003 x%d + %d other orders (1-%d copies each), runtime lambda (SQS batches of up to %d, %d invocations at once), store %s\n",
			f.copies, f.orders, f.maxDup, lab.LambdaBatchSize, f.concurrency, f.store)
	} else {
		fmt.Fprintf(stdout, "dedup-lab: ORDER-003 x%d + %d other orders (1-%d copies each), broker %s, store %s, concurrency %d\n",
			f.copies, f.orders, f.maxDup, f.broker, f.store, f.concurrency)
	}
	if broker.about != "" {
		fmt.Fprintf(stdout, "  broker: %s\n", broker.about)
	}
	if store.about != "" {
		fmt.Fprintf(stdout, "  store:  %s\n", store.about)
	}
	if f.loseAcks > 0 {
		fmt.Fprintf(stdout, "  lost acks: the first delivery of %d messages is nacked after its charge, so the broker redelivers it\n", f.loseAcks)
	}
	fmt.Fprintln(stdout)
}

// printVerdicts writes one line per run and returns the exit status: 1 when
// a run does not show what it should.
func printVerdicts(stdout io.Writer, results []lab.Result) int {
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
				runName(r), r.Charges, r.Messages, again, r.DistinctOrders, r.Acked, r.Pending)
			status = 1
		case r.Shadow:
			lost := ""
			if r.LostAcks > 0 {
				lost = fmt.Sprintf(" + %d lost acks", r.LostAcks)
			}
			fmt.Fprintf(stdout, "idempotency shadow: %d charges for %d messages%s: every copy charged, as without dedup; would skip %d = %d messages%s - %d distinct orders (%.2fs)\n",
				r.Charges, r.Messages, again, r.WouldSkip, r.Messages, lost, r.DistinctOrders, r.Elapsed.Seconds())
		case r.Idempotency:
			fmt.Fprintf(stdout, "idempotency on:  %d charges for %d distinct orders: every order charged exactly once (%.2fs)\n", r.Charges, r.DistinctOrders, r.Elapsed.Seconds())
		default:
			fmt.Fprintf(stdout, "idempotency off: %d charges for %d messages%s: every copy charged again (%.2fs)\n", r.Charges, r.Messages, again, r.Elapsed.Seconds())
		}
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

// runName names a run as -idempotency does.
func runName(r lab.Result) string {
	switch {
	case r.Shadow:
		return "shadow"
	case r.Idempotency:
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
