package reliability_test

import (
	"context"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// The servers most scenarios share, started by TestMain on free loopback
// ports. Scenarios that stop or restart a server start their own.
var (
	redisServer    *testserver.Redis
	dynamoEndpoint string
)

// dynamoTable is the one table every DynamoDB scenario uses; scenarios keep
// apart by scope.
const dynamoTable = "reliability_records"

func TestMain(m *testing.M) {
	// The crash scenario re-executes this test binary as its child consumer.
	if role := os.Getenv(childRoleEnv); role != "" {
		os.Exit(runChild(role))
	}
	goredis.SetLogger(clientLog)
	testserver.Main(m, func() (func(), error) {
		r, err := testserver.StartRedis()
		if err != nil {
			return nil, err
		}
		node, err := testserver.StartDynalite()
		if err != nil {
			_ = r.Close()
			return nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// dynalite has no UpdateTimeToLive; TTL only reclaims storage.
		if err := dynamo.CreateTable(ctx, newDynamoClient(node.Endpoint), dynamo.TableConfig{Table: dynamoTable, SkipTTL: true}); err != nil {
			_ = node.Close()
			_ = r.Close()
			return nil, err
		}
		redisServer, dynamoEndpoint = r, node.Endpoint
		return func() {
			_ = node.Close()
			_ = r.Close()
		}, nil
	})
}

// newDynamoClient returns a DynamoDB client of its own (its own connection
// pool) for the loopback endpoint, with the SDK's default retries.
func newDynamoClient(endpoint string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(endpoint),
		HTTPClient: awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
			t.Proxy = nil
			t.MaxIdleConns = 256
			t.MaxIdleConnsPerHost = 256
			t.MaxConnsPerHost = 8 // one client, one bounded pool, like one process
		}),
	})
}
