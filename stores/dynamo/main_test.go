package dynamo_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// One dynalite per test binary, one table shared by every test: the
// conformance suite keeps each subtest under its own key prefix, and the
// other tests use keys with their test's name.
const testTable = "dedup_records"

var (
	endpoint string
	client   *dynamodb.Client
)

func TestMain(m *testing.M) {
	testserver.Main(m, func() (func(), error) {
		node, err := testserver.StartDynalite()
		if err != nil {
			return nil, err
		}
		endpoint = node.Endpoint
		client = newClient(endpoint, 0)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// dynalite has no UpdateTimeToLive: see TestCreateTable for TTL.
		if err := dynamo.CreateTable(ctx, client, dynamo.TableConfig{Table: testTable, SkipTTL: true}); err != nil {
			_ = node.Close()
			return nil, err
		}
		return func() { _ = node.Close() }, nil
	})
}

// newClient returns a DynamoDB client for the loopback endpoint with static
// credentials. retryMaxAttempts 0 keeps the SDK's default retries (3
// attempts); 1 disables them. The retries are not rate limited: the SDK's
// retry quota, meant to protect a remote service, ran out when dynalite
// reset many of the 200 connections of OneWinnerAmongContenders at once on
// a loaded machine, and the claims failed with "retry quota exceeded". The
// transport keeps enough idle connections for the concurrent tests and
// benchmarks.
func newClient(endpoint string, retryMaxAttempts int) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:           "us-east-1",
		Credentials:      credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint:     aws.String(endpoint),
		RetryMaxAttempts: retryMaxAttempts,
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.RateLimiter = ratelimit.None
		}),
		HTTPClient: awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
			t.Proxy = nil
			t.MaxIdleConns = 256
			t.MaxIdleConnsPerHost = 256
		}),
	})
}

// newStore returns a store on the shared table.
func newStore(t testing.TB, config dynamo.Config) *dynamo.Store {
	t.Helper()
	if config.Client == nil {
		config.Client = client
	}
	if config.Table == "" {
		config.Table = testTable
	}
	config.SkipTTL = true // dynalite has no TTL (see TestNewChecksTheTable)
	s, err := dynamo.New(context.Background(), config)
	if err != nil {
		t.Fatalf("dynamo.New: %v", err)
	}
	return s
}

var epoch = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
