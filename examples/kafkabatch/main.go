// Command kafkabatch is a plain-Go Kafka consumer (franz-go's kgo, no
// Watermill) that processes each poll as one batch through
// dedup.Engine.DoBatch: the claims of all the batch's records go to the
// store together, the handler runs for each record won, the completions go
// together, and only then are the offsets committed. A failed record stops
// its partition's later records (their claims are released together) and
// the partition is consumed again from it.
//
//	go run ./examples/kafkabatch                          # embedded Kafka (kfake)
//	KAFKA_BROKERS=broker1:9092 go run ./examples/kafkabatch
//
// The store is the in-process memory store: swap in stores/redis,
// stores/postgres or stores/dynamo (each claims a batch in one round trip
// or, for DynamoDB, concurrent writes) to share records between
// consumers. See README.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// order is the payload of a record.
type order struct {
	ID       string `json:"order_id"`
	Amount   int    `json:"amount"`
	Currency string `json:"currency"`
}

// demo is what the example produces: copies of one order are records of
// their own, as a producer's retries make them; ORDER-004's first charge
// fails.
var demo = []struct {
	order  order
	copies int
}{
	{order{"ORDER-001", 100, "BRL"}, 1},
	{order{"ORDER-003", 150, "BRL"}, 3},
	{order{"ORDER-004", 80, "BRL"}, 2},
	{order{"ORDER-005", 60, "BRL"}, 2},
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kafkabatch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	brokers := fs.String("kafka-brokers", os.Getenv("KAFKA_BROKERS"), "Kafka bootstrap brokers, comma-separated (default $KAFKA_BROKERS; empty: embedded kfake cluster)")
	topic := fs.String("topic", "orders-batch-demo", "Kafka topic")
	maxBatch := fs.Int("max-batch", 100, "most records per poll, and per DoBatch")
	timeout := fs.Duration("timeout", time.Minute, "give the demo up after this long")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if err := demoRun(ctx, *brokers, *topic, *maxBatch, stdout); err != nil {
		fmt.Fprintln(stderr, "kafkabatch:", err)
		return 1
	}
	return 0
}

func demoRun(ctx context.Context, brokerList, topic string, maxBatch int, out io.Writer) error {
	seeds := strings.Split(brokerList, ",")
	if brokerList == "" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
		if err != nil {
			return fmt.Errorf("starting the embedded Kafka cluster: %w", err)
		}
		defer c.Close()
		seeds = c.ListenAddrs()
	}
	total, err := produce(ctx, seeds, topic)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "produced %d records (%d orders) to %s\n", total, len(demo), topic)

	store, err := memory.New(ctx, memory.Config{})
	if err != nil {
		return err
	}
	engine, err := dedup.NewEngine(dedup.Config{Store: store, Lease: 30 * time.Second, Retention: 24 * time.Hour})
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumerGroup("charge-orders-batch"), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return err
	}
	defer cl.Close()
	c := &consumer{engine: engine, client: cl, out: out, failed: map[string]bool{}}
	for c.committed < total {
		if err := c.pollBatch(ctx, maxBatch); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "committed %d records: %d charges for %d orders, %d retried\n", c.committed, c.charges, len(demo), c.retried)
	return nil
}

// produce writes the demo records, each copy a record of its own.
func produce(ctx context.Context, seeds []string, topic string) (int, error) {
	p, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		return 0, err
	}
	defer p.Close()
	var recs []*kgo.Record
	for _, d := range demo {
		v, err := json.Marshal(d.order)
		if err != nil {
			return 0, err
		}
		for range d.copies {
			recs = append(recs, &kgo.Record{Value: v})
		}
	}
	if err := p.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return 0, fmt.Errorf("producing: %w", err)
	}
	return len(recs), nil
}

// consumer is the batch consumer: its engine, its client, what it did.
type consumer struct {
	engine    *dedup.Engine
	client    *kgo.Client
	out       io.Writer
	failed    map[string]bool // orders whose first charge failed already
	committed int
	charges   int
	retried   int
}

// pollBatch polls one batch and processes it: DoBatch, then the offsets of
// every record up to each partition's first failure are committed, and a
// partition that failed is consumed again from its failed record.
func (c *consumer) pollBatch(ctx context.Context, maxBatch int) error {
	fetches := c.client.PollRecords(ctx, maxBatch)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("before every record was committed: %w", err)
	}
	if errs := fetches.Errors(); len(errs) > 0 {
		return fmt.Errorf("polling: %w", errs[0].Err)
	}
	recs := fetches.Records()
	calls := make([]dedup.BatchCall, len(recs))
	orders := make([]order, len(recs))
	for i, r := range recs {
		// A partition is ordered: its records are one group, stopped at
		// its first failure.
		calls[i] = dedup.BatchCall{Group: fmt.Sprint(r.Topic, "/", r.Partition), Call: dedup.Call{
			Scope: "charge-orders", MessageUUID: fmt.Sprint(r.Topic, "/", r.Partition, "/", r.Offset)}}
		if err := json.Unmarshal(r.Value, &orders[i]); err != nil || orders[i].ID == "" {
			calls[i].Err = fmt.Errorf("%w: record %d/%d: no order_id", dedup.ErrNoKey, r.Partition, r.Offset)
			continue
		}
		calls[i].Key = orders[i].ID
	}
	results, errs := c.engine.DoBatch(ctx, dedup.Batch{Calls: calls}, func(ctx context.Context, i int) ([]byte, error) {
		return nil, c.charge(orders[i])
	})

	// Commit each partition up to its first failure; rewind to it.
	var commit []*kgo.Record
	rewind := map[string]map[int32]kgo.EpochOffset{}
	for i, r := range results {
		rec := recs[i]
		if _, stopped := rewind[rec.Topic][rec.Partition]; stopped {
			continue
		}
		if err := errs[i]; err != nil && !dedup.IsPermanent(err) { // a permanent error would go to a dead-letter topic
			if rewind[rec.Topic] == nil {
				rewind[rec.Topic] = map[int32]kgo.EpochOffset{}
			}
			rewind[rec.Topic][rec.Partition] = kgo.EpochOffset{Epoch: -1, Offset: rec.Offset}
			fmt.Fprintf(c.out, "%s: %v; partition %d consumed again from offset %d\n", orders[i].ID, err, rec.Partition, rec.Offset)
			continue
		}
		if errs[i] == nil && r.Outcome == dedup.Duplicate {
			fmt.Fprintf(c.out, "%s: duplicate, skipped\n", orders[i].ID)
		}
		commit = append(commit, rec)
	}
	if len(commit) > 0 {
		if err := c.client.CommitRecords(ctx, commit...); err != nil {
			return fmt.Errorf("committing: %w", err)
		}
		c.committed += len(commit)
	}
	if len(rewind) > 0 {
		c.retried++
		c.client.SetOffsets(rewind)
	}
	return nil
}

// errDeclined is the demo's failure: ORDER-004's first charge.
var errDeclined = errors.New("card declined")

// charge is the effect.
func (c *consumer) charge(o order) error {
	if o.ID == "ORDER-004" && !c.failed[o.ID] {
		c.failed[o.ID] = true
		return errDeclined
	}
	c.charges++
	fmt.Fprintf(c.out, "%s: charged %d %s\n", o.ID, o.Amount, o.Currency)
	return nil
}
