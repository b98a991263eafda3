// Command lambda is a "charge order" AWS Lambda function fed by SQS (an
// event source mapping with ReportBatchItemFailures), deduplicated with
// lambdadedup on DynamoDB: an order is charged once however many copies
// arrive, each with its own MessageId, and a router consuming the same
// orders elsewhere with the same table and scope shares its records.
//
// In Lambda (the provided.al2023 runtime) it calls lambda.Start; set
// DEDUP_TABLE to the DynamoDB table (created by -create-table). Locally,
// -local runs the function against any SQS endpoint through an in-process
// event source mapping (lambdadedup/esm): it sends ORDER-003 ten times and
// prints what was charged:
//
//	node examples/sqs/fauxqs.mjs &
//	AWS_ENDPOINT_URL=http://127.0.0.1:4566 go run ./examples/lambda -local
//
// Endpoint, region and credentials come from the AWS SDK's standard
// environment. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/examples/lambda/esm"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// scope is shared with any Watermill router that charges the same orders
// (its handler name or dedup.Config.Scope).
const scope = "charge-orders"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lambda", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		local       = fs.Bool("local", false, "run against SQS through an in-process event source mapping instead of lambda.Start")
		createTable = fs.Bool("create-table", false, "create the DEDUP_TABLE table and exit")
		table       = fs.String("table", os.Getenv("DEDUP_TABLE"), "DynamoDB table of the records (default $DEDUP_TABLE; -local without it: in-memory store)")
		queue       = fs.String("queue", "lambda-example-orders", "-local: the queue (created, with a 1s visibility timeout)")
		copies      = fs.Int("copies", 10, "-local: how many times ORDER-003 is sent")
		batch       = fs.Int("batch-size", 10, "-local: records per invocation (1..10)")
		invocations = fs.Int("invocations", 5, "-local: invocations at once")
		idempotency = fs.Bool("idempotency", true, "-local: false runs the same handler without lambdadedup")
		timeout     = fs.Duration("timeout", time.Minute, "-local: give up after this long")
		verbose     = fs.Bool("v", false, "log lambdadedup's decisions to stderr")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var logger watermill.LoggerAdapter = watermill.NopLogger{}
	if *verbose {
		logger = watermill.NewStdLoggerWithOut(stderr, false, false)
	}
	awsCfg, err := loadAWS(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "lambda: %v\n", err)
		return 1
	}
	if *createTable {
		if *table == "" {
			fmt.Fprintln(stderr, "lambda: -create-table needs -table or DEDUP_TABLE")
			return 2
		}
		if err := dynamo.CreateTable(ctx, dynamodb.NewFromConfig(awsCfg), dynamo.TableConfig{Table: *table}); err != nil {
			fmt.Fprintf(stderr, "lambda: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "table %s created\n", *table)
		return 0
	}

	var store dedup.Store
	switch {
	case *table != "":
		store, err = dynamo.New(ctx, dynamo.Config{Client: dynamodb.NewFromConfig(awsCfg), Table: *table})
		if err != nil {
			fmt.Fprintf(stderr, "lambda: %v\n", err)
			return 1
		}
	case *local:
		store, err = memory.New(ctx, memory.Config{}) // one process: the simulated invocations share it
		if err != nil {
			fmt.Fprintf(stderr, "lambda: %v\n", err)
			return 1
		}
	default:
		fmt.Fprintln(stderr, "lambda: set DEDUP_TABLE to the DynamoDB table of the records")
		return 2
	}
	var charges atomic.Int64
	charge := newCharger(stdout, &charges)
	h, err := lambdadedup.New(lambdadedup.Config{
		Dedup: dedup.Config{Store: store, Key: keyfuncs.JSON("order_id"), Scope: scope, Logger: logger},
	}, charge)
	if err != nil {
		fmt.Fprintf(stderr, "lambda: %v\n", err)
		return 1
	}
	if !*local {
		lambda.Start(h.Handle) // never returns
		return 0
	}
	if *batch < 1 || *batch > 10 || *copies < 1 || *invocations < 1 {
		fmt.Fprintln(stderr, "lambda: -batch-size must be 1..10, -copies and -invocations at least 1")
		return 2
	}
	var handler any = h.Handle
	if !*idempotency {
		handler = plainHandler(charge)
	}
	return runLocal(ctx, awsCfg, localRun{queue: *queue, copies: *copies, batch: int32(*batch), invocations: *invocations,
		idempotency: *idempotency, timeout: *timeout, handler: handler, charges: &charges}, stdout, stderr)
}

type localRun struct {
	queue       string
	copies      int
	batch       int32
	invocations int
	idempotency bool
	timeout     time.Duration
	handler     any
	charges     *atomic.Int64
}

// runLocal sends ORDER-003 r.copies times and runs the event source
// mapping until every copy is deleted.
func runLocal(ctx context.Context, awsCfg aws.Config, r localRun, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	client := sqs.NewFromConfig(awsCfg)
	out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(r.queue), Attributes: map[string]string{"VisibilityTimeout": "1"}})
	if err != nil {
		fmt.Fprintf(stderr, "lambda: creating queue %s: %v\n", r.queue, err)
		return 1
	}
	queueURL := aws.ToString(out.QueueUrl)
	if _, err := client.PurgeQueue(ctx, &sqs.PurgeQueueInput{QueueUrl: aws.String(queueURL)}); err != nil {
		fmt.Fprintf(stderr, "lambda: purging queue %s: %v\n", r.queue, err)
		return 1
	}
	for range r.copies {
		body := `{"order_id":"ORDER-003","amount":150,"currency":"BRL"}`
		if _, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(queueURL), MessageBody: aws.String(body)}); err != nil {
			fmt.Fprintf(stderr, "lambda: SendMessage: %v\n", err)
			return 1
		}
	}
	mode := "on"
	if !r.idempotency {
		mode = "off"
	}
	fmt.Fprintf(stdout, "sent ORDER-003 x%d to %s; batch size %d, %d invocations at once, idempotency %s\n", r.copies, r.queue, r.batch, r.invocations, mode)
	m := esm.Mapping{Client: client, QueueURL: queueURL, BatchSize: r.batch, Invocations: r.invocations,
		Function: func() lambda.Handler { return lambda.NewHandler(r.handler) }}
	stats, err := m.Run(ctx, func(s esm.Stats) bool { return s.Deleted >= r.copies })
	if err != nil {
		fmt.Fprintf(stderr, "lambda: waiting for the %d copies to be deleted: %v\n", r.copies, err)
		return 1
	}
	fmt.Fprintf(stdout, "%d charges for %d messages: %d invocations, %d records delivered, %d batch item failures, %d redeliveries\n",
		r.charges.Load(), r.copies, stats.Invocations, stats.Records, stats.Failures, stats.Redeliveries)
	return 0
}

// loadAWS loads the SDK's standard configuration; for a loopback
// AWS_ENDPOINT_URL (an emulator) the region and credentials default to
// us-east-1 and test/test.
func loadAWS(ctx context.Context) (aws.Config, error) {
	var opts []func(*config.LoadOptions) error
	if u, err := url.Parse(os.Getenv("AWS_ENDPOINT_URL")); err == nil && (u.Hostname() == "127.0.0.1" || u.Hostname() == "localhost") {
		if os.Getenv("AWS_REGION") == "" {
			opts = append(opts, config.WithRegion("us-east-1"))
		}
		if os.Getenv("AWS_ACCESS_KEY_ID") == "" {
			opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("test", "test", "")))
		}
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return aws.Config{}, err
	}
	if cfg.Region == "" {
		return aws.Config{}, errors.New("no AWS region: set AWS_REGION, or AWS_ENDPOINT_URL=http://127.0.0.1:4566 for a local emulator")
	}
	return cfg, nil
}
