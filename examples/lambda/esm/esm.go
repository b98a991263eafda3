// Package esm simulates an AWS Lambda event source mapping for SQS, so that
// an SQS batch handler can be run and tested on an SQS emulator (or a real
// queue) without deploying it: it receives batches of up to ten messages,
// invokes the handler in process through aws-lambda-go's lambda.Handler
// interface with the JSON event Lambda would send, deletes the records the
// handler did not report in BatchItemFailures, and leaves the others to
// reappear after the queue's visibility timeout, as the real mapping does
// with ReportBatchItemFailures on.
//
// It is a test tool: no batching window, no scaling, no retry backoff.
package esm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// Client is the part of *sqs.Client the mapping uses.
type Client interface {
	ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, opts ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
	GetQueueAttributes(ctx context.Context, in *sqs.GetQueueAttributesInput, opts ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
}

// Mapping is one event source mapping: a queue, a function, how many
// records a batch holds and how many invocations run at once.
type Mapping struct {
	// Client reads and deletes the messages. Required.
	Client Client
	// QueueURL is the queue. Required.
	QueueURL string
	// Function returns the handler of one execution environment, e.g.
	// func() lambda.Handler { return lambda.NewHandler(h.Handle) }. It is
	// called once per concurrent invocation (Invocations times): like
	// Lambda, the mapping never invokes one environment twice at once
	// (aws-lambda-go's handlers reuse their response buffer). Required.
	Function func() lambda.Handler
	// BatchSize is the most records one invocation gets (1..10). Defaults
	// to 10.
	BatchSize int32
	// Invocations is how many invocations run at once (pollers). Defaults
	// to 1.
	Invocations int
	// FunctionTimeout is each invocation's deadline, from its start.
	// Defaults to 3s (Lambda's default timeout).
	FunctionTimeout time.Duration
	// WaitTime is the long-poll wait of each receive, in whole seconds.
	// Defaults to 1s.
	WaitTime time.Duration
	// Region is the records' awsRegion. Defaults to us-east-1.
	Region string
}

// Stats is what a run did.
type Stats struct {
	Invocations  int // handler invocations
	Records      int // records delivered (with redeliveries)
	Failures     int // records reported in BatchItemFailures (or of a failed invocation)
	Deleted      int // records deleted after a successful invocation
	Redeliveries int // records delivered with ApproximateReceiveCount > 1
	InvokeErrors int // invocations that returned an error: their whole batch failed
	// Deliveries counts the deliveries of each MessageId.
	Deliveries map[string]int
	// Batches lists the MessageIds of each batch, in invocation order.
	Batches [][]string
}

func (s Stats) clone() Stats {
	c := s
	c.Deliveries = make(map[string]int, len(s.Deliveries))
	for k, v := range s.Deliveries {
		c.Deliveries[k] = v
	}
	c.Batches = append([][]string(nil), s.Batches...)
	return c
}

// Run polls the queue and invokes the handler until done, called with the
// figures so far after every invocation and every empty receive, returns
// true. It returns the figures and, when ctx ends first, an error wrapping
// ctx's. done must be fast; it is called with a lock held.
func (m *Mapping) Run(ctx context.Context, done func(Stats) bool) (Stats, error) {
	if m.Client == nil || m.QueueURL == "" || m.Function == nil {
		return Stats{}, errors.New("esm: Mapping.Client, QueueURL and Function are required")
	}
	cfg := *m
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 10
	}
	if cfg.BatchSize < 1 || cfg.BatchSize > 10 {
		return Stats{}, fmt.Errorf("esm: BatchSize must be 1..10, got %d", cfg.BatchSize)
	}
	if cfg.Invocations == 0 {
		cfg.Invocations = 1
	}
	if cfg.FunctionTimeout == 0 {
		cfg.FunctionTimeout = 3 * time.Second
	}
	if cfg.WaitTime == 0 {
		cfg.WaitTime = time.Second
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	attrs, err := cfg.Client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(cfg.QueueURL), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn},
	})
	if err != nil {
		return Stats{}, fmt.Errorf("esm: reading the queue's ARN: %w", err)
	}
	arn := attrs.Attributes[string(types.QueueAttributeNameQueueArn)]

	var (
		mu    sync.Mutex
		stats = Stats{Deliveries: map[string]int{}}
		errs  []error
	)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	check := func() {
		if done(stats) {
			stop()
		}
	}
	mu.Lock()
	check()
	mu.Unlock()

	var wg sync.WaitGroup
	for range cfg.Invocations {
		wg.Add(1)
		fn := cfg.Function()
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				err := cfg.poll(runCtx, fn, arn, func(f func(*Stats)) {
					mu.Lock()
					defer mu.Unlock()
					f(&stats)
					check()
				})
				if err != nil && runCtx.Err() == nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					stop()
				}
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	out := stats.clone()
	if len(errs) > 0 {
		return out, errors.Join(errs...)
	}
	if !done(stats) {
		return out, fmt.Errorf("esm: stopped before done: %w", ctx.Err())
	}
	return out, nil
}

// poll receives one batch, invokes the handler and deletes what succeeded.
func (m *Mapping) poll(ctx context.Context, fn lambda.Handler, arn string, update func(func(*Stats))) error {
	out, err := m.Client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(m.QueueURL),
		MaxNumberOfMessages:         m.BatchSize,
		WaitTimeSeconds:             int32(m.WaitTime / time.Second),
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("esm: ReceiveMessage: %w", err)
	}
	if len(out.Messages) == 0 {
		update(func(*Stats) {})
		return nil
	}
	event := events.SQSEvent{Records: make([]events.SQSMessage, len(out.Messages))}
	ids := make([]string, len(out.Messages))
	for i, msg := range out.Messages {
		event.Records[i] = Record(msg, arn, m.Region)
		ids[i] = aws.ToString(msg.MessageId)
	}
	payload, err := json.Marshal(event)
	if err != nil {
		return err
	}

	// The invocation's own context: Lambda gives it a deadline and a
	// request id, and it does not end when the poller is told to stop.
	invCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.FunctionTimeout)
	invCtx = lambdacontext.NewContext(invCtx, &lambdacontext.LambdaContext{AwsRequestID: "esm-" + ids[0], InvokedFunctionArn: "arn:aws:lambda:" + m.Region + ":000000000000:function:esm"})
	respJSON, invokeErr := fn.Invoke(invCtx, payload)
	cancel()

	failed := map[string]bool{}
	if invokeErr == nil {
		var resp events.SQSEventResponse
		if err := json.Unmarshal(respJSON, &resp); err != nil {
			invokeErr = fmt.Errorf("esm: the response is not an SQSEventResponse: %w", err)
		}
		for _, f := range resp.BatchItemFailures {
			if !contains(ids, f.ItemIdentifier) {
				// Lambda treats the whole batch as failed.
				invokeErr = fmt.Errorf("esm: BatchItemFailures names %q, not in the batch", f.ItemIdentifier)
				break
			}
			failed[f.ItemIdentifier] = true
		}
	}
	var del []types.DeleteMessageBatchRequestEntry
	if invokeErr == nil {
		for i, msg := range out.Messages {
			if !failed[ids[i]] {
				del = append(del, types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: msg.ReceiptHandle})
			}
		}
	}
	if len(del) > 0 {
		res, err := m.Client.DeleteMessageBatch(context.WithoutCancel(ctx), &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(m.QueueURL), Entries: del})
		if err != nil {
			return fmt.Errorf("esm: DeleteMessageBatch: %w", err)
		}
		if len(res.Failed) > 0 {
			return fmt.Errorf("esm: DeleteMessageBatch failed for %d entries: %s", len(res.Failed), aws.ToString(res.Failed[0].Message))
		}
	}
	update(func(s *Stats) {
		s.Invocations++
		s.Records += len(ids)
		s.Batches = append(s.Batches, ids)
		for i, msg := range out.Messages {
			s.Deliveries[ids[i]]++
			if n, _ := strconv.Atoi(msg.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]); n > 1 {
				s.Redeliveries++
			}
		}
		if invokeErr != nil {
			s.InvokeErrors++
			s.Failures += len(ids)
			return
		}
		s.Failures += len(failed)
		s.Deleted += len(del)
	})
	return nil
}

func contains(ids []string, id string) bool {
	for _, v := range ids {
		if v == id {
			return true
		}
	}
	return false
}

// Record converts a received SQS message into the record of the event
// Lambda sends for it.
func Record(msg types.Message, queueARN, region string) events.SQSMessage {
	r := events.SQSMessage{
		MessageId:              aws.ToString(msg.MessageId),
		ReceiptHandle:          aws.ToString(msg.ReceiptHandle),
		Body:                   aws.ToString(msg.Body),
		Md5OfBody:              aws.ToString(msg.MD5OfBody),
		Md5OfMessageAttributes: aws.ToString(msg.MD5OfMessageAttributes),
		Attributes:             map[string]string{},
		MessageAttributes:      map[string]events.SQSMessageAttribute{},
		EventSourceARN:         queueARN,
		EventSource:            "aws:sqs",
		AWSRegion:              region,
	}
	for k, v := range msg.Attributes {
		r.Attributes[k] = v
	}
	for k, v := range msg.MessageAttributes {
		r.MessageAttributes[k] = events.SQSMessageAttribute{
			StringValue:      v.StringValue,
			BinaryValue:      v.BinaryValue,
			StringListValues: v.StringListValues,
			BinaryListValues: v.BinaryListValues,
			DataType:         aws.ToString(v.DataType),
		}
	}
	return r
}
