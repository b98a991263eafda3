package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
)

// LambdaBatchSize is the batch size of the lab's Lambda runtime: SQS's
// largest receive.
const LambdaBatchSize = 10

// RunLambda runs the lab in Lambda shape, in process: the orders become SQS
// records (each copy its own MessageId), cfg.Concurrency invocations at once
// take batches of up to LambdaBatchSize records and call the handler through
// aws-lambda-go's lambda.Handler with the JSON event; records reported in
// BatchItemFailures come back after cfg.EffectTime (a short visibility
// timeout). With idempotency on, the handler is a lambdadedup.Handler on
// cfg.NewStore; off, it charges every record. cfg.NewTransport and
// cfg.LoseAcks are not used.
func RunLambda(ctx context.Context, cfg Config, off, on bool) ([]Result, error) {
	if cfg.NewStore == nil {
		return nil, errors.New("lab: NewStore is required")
	}
	if cfg.LoseAcks != 0 {
		return nil, errors.New("lab: lost acks are not simulated in the Lambda runtime")
	}
	cfg.setDefaults()
	var results []Result
	for _, idem := range []bool{false, true} {
		if idem && !on || !idem && !off {
			continue
		}
		r, err := runLambdaOnce(ctx, cfg, idem)
		if err != nil {
			return results, err
		}
		results = append(results, r)
	}
	return results, nil
}

func runLambdaOnce(ctx context.Context, cfg Config, idempotency bool) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	msgs, distinct := Orders(cfg)
	res := Result{Idempotency: idempotency, Shadow: idempotency && cfg.Shadow, Messages: len(msgs), DistinctOrders: distinct, Outcomes: map[dedup.Event]int{}}
	obs := &counter{outcomes: map[dedup.Event]int{}}

	var charges atomic.Int64
	charge := func(msg *message.Message) error {
		if _, err := keyfuncs.JSON("order_id")(msg); err != nil {
			return err
		}
		select {
		case <-time.After(cfg.EffectTime): // the payment gateway
		case <-msg.Context().Done():
			return msg.Context().Err()
		}
		charges.Add(1)
		return nil
	}
	var handler any
	if idempotency {
		store, err := cfg.NewStore(ctx)
		if err != nil {
			return res, fmt.Errorf("lab: store %s: %w", cfg.StoreName, err)
		}
		h, err := lambdadedup.New(lambdadedup.Config{
			Scope: "charge-orders-" + watermill.NewShortUUID(), // a fresh scope per run: a shared store may hold earlier runs
			Dedup: dedup.Config{Store: store, Key: keyfuncs.JSON("order_id"), Observer: obs, Logger: cfg.Logger, Shadow: cfg.Shadow},
		}, charge)
		if err != nil {
			return res, err
		}
		handler = h.Handle
	} else {
		handler = func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
			var resp events.SQSEventResponse
			for _, r := range ev.Records {
				msg := lambdadedup.Message(r)
				msg.SetContext(ctx)
				if err := charge(msg); err != nil {
					resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: r.MessageId})
				}
			}
			return resp, nil
		}
	}

	queue := make(chan events.SQSMessage, len(msgs))
	for _, m := range msgs {
		order, _ := m.Metadata["order_id"]
		queue <- events.SQSMessage{
			MessageId: m.UUID, Body: string(m.Payload), EventSource: "aws:sqs",
			EventSourceARN: "arn:aws:sqs:us-east-1:000000000000:orders", AWSRegion: "us-east-1",
			MessageAttributes: map[string]events.SQSMessageAttribute{"order_id": {DataType: "String", StringValue: &order}},
		}
	}
	var (
		mu       sync.Mutex
		acked    int
		failures int
		allAcked = make(chan struct{})
		errs     []error
		wg       sync.WaitGroup
		again    sync.WaitGroup // records waiting for their visibility timeout
	)
	start := time.Now()
	for range cfg.Concurrency {
		wg.Add(1)
		fn := lambda.NewHandler(handler) // one execution environment
		go func() {
			defer wg.Done()
			for {
				var batch []events.SQSMessage
				select {
				case r := <-queue:
					batch = append(batch, r)
				case <-allAcked:
					return
				case <-ctx.Done():
					return
				}
			fill:
				for len(batch) < LambdaBatchSize {
					select {
					case r := <-queue:
						batch = append(batch, r)
					default:
						break fill
					}
				}
				failed, err := invokeBatch(ctx, fn, batch)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
					mu.Unlock()
					cancel()
					return
				}
				failures += len(failed)
				acked += len(batch) - len(failed)
				if acked == len(msgs) {
					close(allAcked)
				}
				mu.Unlock()
				for _, r := range batch {
					if failed[r.MessageId] {
						again.Add(1)
						time.AfterFunc(cfg.EffectTime, func() { defer again.Done(); queue <- r })
					}
				}
			}
		}()
	}
	var waitErr error
	select {
	case <-allAcked:
	case <-ctx.Done():
		waitErr = fmt.Errorf("lab: lambda run timed out waiting for every record to be processed: %w", ctx.Err())
	}
	wg.Wait()
	again.Wait()
	res.Elapsed = time.Since(start)
	mu.Lock()
	res.Acked, res.HandlerErrors = acked, failures
	if len(errs) > 0 {
		waitErr = errors.Join(errs...)
	}
	mu.Unlock()
	res.Charges = int(charges.Load())
	obs.copyTo(&res)
	return res, waitErr
}

// invokeBatch invokes one batch as the Lambda runtime does and returns the
// MessageIds listed in BatchItemFailures.
func invokeBatch(ctx context.Context, fn lambda.Handler, batch []events.SQSMessage) (map[string]bool, error) {
	payload, err := json.Marshal(events.SQSEvent{Records: batch})
	if err != nil {
		return nil, err
	}
	invCtx, cancel := context.WithTimeout(ctx, 30*time.Second) // the function's timeout
	defer cancel()
	out, err := fn.Invoke(invCtx, payload)
	if err != nil {
		return nil, fmt.Errorf("lab: invocation failed: %w", err)
	}
	var resp events.SQSEventResponse
	if err := json.Unmarshal(out, &resp); err != nil {
		return nil, fmt.Errorf("lab: invocation response %s: %w", out, err)
	}
	failed := map[string]bool{}
	for _, f := range resp.BatchItemFailures {
		failed[f.ItemIdentifier] = true
	}
	return failed, nil
}
