package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

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
	r := newRun(cfg, idempotency)
	handler, err := r.lambdaHandler(ctx)
	if err != nil {
		return r.result(0), err
	}
	queue := sqsRecords(r.msgs)
	var (
		wg    sync.WaitGroup
		again sync.WaitGroup // records waiting for their visibility timeout
		errs  = make(chan error, cfg.Concurrency)
	)
	r.start = time.Now()
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.environment(ctx, lambda.NewHandler(handler), queue, &again); err != nil {
				errs <- err
				cancel()
			}
		}()
	}
	var waitErr error
	select {
	case <-r.allAcked:
	case <-ctx.Done():
		waitErr = fmt.Errorf("lab: lambda run timed out waiting for every record to be processed: %w", ctx.Err())
	}
	wg.Wait()
	again.Wait()
	res := r.result(0)
	res.Elapsed = time.Since(r.start)
	close(errs)
	var invokeErrs []error
	for err := range errs {
		invokeErrs = append(invokeErrs, err)
	}
	if len(invokeErrs) > 0 {
		waitErr = errors.Join(invokeErrs...)
	}
	return res, waitErr
}

// lambdaHandler returns the function's handler: lambdadedup's on the store
// (idempotency on, a fresh scope per run), or a batch handler that charges
// every record (off).
func (r *run) lambdaHandler(ctx context.Context) (any, error) {
	if !r.idempotency {
		return func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
			var resp events.SQSEventResponse
			for _, rec := range ev.Records {
				msg := lambdadedup.Message(rec)
				msg.SetContext(ctx)
				if err := r.charge(msg); err != nil {
					resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: rec.MessageId})
				}
			}
			return resp, nil
		}, nil
	}
	store, err := r.cfg.NewStore(ctx)
	if err != nil {
		return nil, fmt.Errorf("lab: store %s: %w", r.cfg.StoreName, err)
	}
	h, err := lambdadedup.New(lambdadedup.Config{
		Dedup: dedup.Config{Store: store, Key: keyfuncs.JSON("order_id"), Scope: r.newScope(), Retention: Retention, Observer: r.obs, Logger: r.cfg.Logger, Shadow: r.cfg.Shadow},
	}, r.charge)
	if err != nil {
		return nil, err
	}
	return h.Handle, nil
}

// sqsRecords turns the messages into SQS records (MessageId: the UUID) in
// a queue with room for all of them.
func sqsRecords(msgs []*message.Message) chan events.SQSMessage {
	queue := make(chan events.SQSMessage, len(msgs))
	for _, m := range msgs {
		order := m.Metadata["order_id"]
		queue <- events.SQSMessage{
			MessageId: m.UUID, Body: string(m.Payload), EventSource: "aws:sqs",
			EventSourceARN: "arn:aws:sqs:us-east-1:000000000000:orders", AWSRegion: "us-east-1",
			MessageAttributes: map[string]events.SQSMessageAttribute{"order_id": {DataType: "String", StringValue: &order}},
		}
	}
	return queue
}

// environment is one execution environment: it takes batches of up to
// LambdaBatchSize records, invokes fn with each, and puts the records
// reported in BatchItemFailures back after EffectTime (their visibility
// timeout), until every record was acked or ctx ends.
func (r *run) environment(ctx context.Context, fn lambda.Handler, queue chan events.SQSMessage, again *sync.WaitGroup) error {
	for {
		batch := takeBatch(ctx, queue, r.allAcked)
		if batch == nil {
			return nil
		}
		failed, err := invokeBatch(ctx, fn, batch)
		if err != nil {
			return err
		}
		r.recordBatch(batch, failed)
		for _, rec := range batch {
			if failed[rec.MessageId] {
				again.Add(1)
				time.AfterFunc(r.cfg.EffectTime, func() { defer again.Done(); queue <- rec })
			}
		}
	}
}

// takeBatch waits for one record, then takes what else is waiting, up to
// LambdaBatchSize; nil once done is closed or ctx ends.
func takeBatch(ctx context.Context, queue chan events.SQSMessage, done <-chan struct{}) []events.SQSMessage {
	var batch []events.SQSMessage
	select {
	case rec := <-queue:
		batch = append(batch, rec)
	case <-done:
		return nil
	case <-ctx.Done():
		return nil
	}
	for len(batch) < LambdaBatchSize {
		select {
		case rec := <-queue:
			batch = append(batch, rec)
		default:
			return batch
		}
	}
	return batch
}

// recordBatch counts the batch's acks (records not reported as failed) and
// failures.
func (r *run) recordBatch(batch []events.SQSMessage, failed map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range batch {
		if failed[rec.MessageId] {
			r.nacks.Add(1)
			continue
		}
		if !r.acked[rec.MessageId] {
			r.acked[rec.MessageId] = true
			if len(r.acked) == len(r.msgs) {
				close(r.allAcked)
			}
		}
	}
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
		// A function error fails the whole batch, as an SQS event source
		// mapping treats it: every record comes back after its visibility
		// timeout (lambdadedup returns ErrBatchFailed when every record
		// failed). A function that always fails leaves records unacked
		// and the run ends at its timeout with an error.
		failed := make(map[string]bool, len(batch))
		for _, rec := range batch {
			failed[rec.MessageId] = true
		}
		return failed, nil
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
