package lambdadedup_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/examples/lambda/esm"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// One fauxqs, one redis-server and one dynalite per test binary; every
// test makes its own queues, scopes and keys.
var (
	sqsClient    *sqs.Client
	dynamoClient *dynamodb.Client
	redisAddr    string
)

const dynamoTable = "lambdadedup_records"

func TestMain(m *testing.M) {
	testserver.Main(m, func() (func(), error) {
		var closers []func() error
		cleanup := func() {
			for _, c := range closers {
				_ = c()
			}
		}
		fauxqs, err := testserver.StartFauxqs()
		if err != nil {
			return nil, err
		}
		closers = append(closers, fauxqs.Close)
		r, err := testserver.StartRedis()
		if err != nil {
			cleanup()
			return nil, err
		}
		closers = append(closers, r.Close)
		dynalite, err := testserver.StartDynalite()
		if err != nil {
			cleanup()
			return nil, err
		}
		closers = append(closers, dynalite.Close)

		redisAddr = r.Addr
		httpClient := awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) { t.Proxy = nil })
		creds := credentials.NewStaticCredentialsProvider("test", "test", "")
		sqsClient = sqs.New(sqs.Options{Region: "us-east-1", Credentials: creds, BaseEndpoint: aws.String(fauxqs.Endpoint), HTTPClient: httpClient})
		dynamoClient = dynamodb.New(dynamodb.Options{Region: "us-east-1", Credentials: creds, BaseEndpoint: aws.String(dynalite.Endpoint), HTTPClient: httpClient})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := dynamo.CreateTable(ctx, dynamoClient, dynamo.TableConfig{Table: dynamoTable, SkipTTL: true}); err != nil {
			cleanup()
			return nil, err
		}
		return cleanup, nil
	})
}

var queueSeq atomic.Int64

// newQueue creates a queue with a 1s visibility timeout: a failed record
// is back a second later.
func newQueue(t *testing.T, fifo bool) string {
	t.Helper()
	name := fmt.Sprintf("lambdadedup-%d", queueSeq.Add(1))
	attrs := map[string]string{"VisibilityTimeout": "1"}
	if fifo {
		name += ".fifo"
		attrs["FifoQueue"] = "true"
	}
	out, err := sqsClient.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatalf("CreateQueue: %v", err)
	}
	url := aws.ToString(out.QueueUrl)
	t.Cleanup(func() {
		_, _ = sqsClient.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	})
	return url
}

// send sends each body as its own message (its own MessageId) and returns
// the MessageIds. group, when set, makes them FIFO messages of that group.
func send(t *testing.T, url, group string, bodies ...string) []string {
	t.Helper()
	var ids []string
	for i, b := range bodies {
		in := &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String(b)}
		if group != "" {
			in.MessageGroupId = aws.String(group)
			in.MessageDeduplicationId = aws.String(fmt.Sprintf("%s-%d-%d", group, i, time.Now().UnixNano()))
		}
		out, err := sqsClient.SendMessage(context.Background(), in)
		if err != nil {
			t.Fatalf("SendMessage: %v", err)
		}
		ids = append(ids, aws.ToString(out.MessageId))
	}
	return ids
}

// runMapping runs the mapping until done holds, for at most a minute.
func runMapping(t *testing.T, m esm.Mapping, what string, done func(esm.Stats) bool) esm.Stats {
	t.Helper()
	m.Client = sqsClient
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stats, err := m.Run(ctx, done)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("timed out after 1m waiting for %s: %v (so far: %d invocations, %d records, %d failures, %d deleted)",
				what, err, stats.Invocations, stats.Records, stats.Failures, stats.Deleted)
		}
		t.Fatalf("event source mapping: %v", err)
	}
	return stats
}

// depth is what the queue still holds, visible or in flight.
func depth(t *testing.T, url string) int {
	t.Helper()
	out, err := sqsClient.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url),
		AttributeNames: []types.QueueAttributeName{
			types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var n, total int
	for _, v := range out.Attributes {
		_, _ = fmt.Sscan(v, &n)
		total += n
	}
	return total
}

var _ dedup.Store = (*dynamo.Store)(nil)
