package dynamo_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// ttlAnswer forwards everything to dynalite except DescribeTimeToLive,
// which dynalite does not implement: it answers status on attribute, and
// counts the calls.
type ttlAnswer struct {
	*dynamodb.Client
	status    types.TimeToLiveStatus
	attribute string
	calls     atomic.Int32
}

func (c *ttlAnswer) DescribeTimeToLive(context.Context, *dynamodb.DescribeTimeToLiveInput, ...func(*dynamodb.Options)) (*dynamodb.DescribeTimeToLiveOutput, error) {
	c.calls.Add(1)
	return &dynamodb.DescribeTimeToLiveOutput{TimeToLiveDescription: &types.TimeToLiveDescription{
		TimeToLiveStatus: c.status, AttributeName: aws.String(c.attribute)}}, nil
}

// TestNewChecksTheTable: New refuses, once, a table that cannot hold the
// records, saying what to change: a missing one (it nacked every message
// about once a millisecond with ResourceNotFoundException), a key schema
// other than the store's, TTL off (unless SkipTTL). SkipTableCheck sends
// nothing.
func TestNewChecksTheTable(t *testing.T) {
	ctx := context.Background()
	on := &ttlAnswer{Client: client, status: types.TimeToLiveStatusEnabled, attribute: "ttl"}
	if _, err := dynamo.New(ctx, dynamo.Config{Client: on, Table: testTable}); err != nil {
		t.Fatalf("the test table, TTL on: %v", err)
	}

	_, err := dynamo.New(ctx, dynamo.Config{Client: on, Table: "missing_" + storekit.NewToken()[:8]})
	var notFound *types.ResourceNotFoundException
	if !errors.Is(err, dynamo.ErrTableNotFound) || !errors.As(err, &notFound) || !strings.Contains(err.Error(), "CreateTable") {
		t.Errorf("missing table: %v, want ErrTableNotFound with the SDK's error and what to do", err)
	}

	other := "id_" + storekit.NewToken()[:8] // partition key "id"
	if err := dynamo.CreateTable(ctx, client, dynamo.TableConfig{Table: other, PartitionKey: "id", SkipTTL: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := dynamo.New(ctx, dynamo.Config{Client: on, Table: other}); !errors.Is(err, dynamo.ErrTableSchema) || !strings.Contains(err.Error(), "Attributes.PartitionKey") {
		t.Errorf("key schema %q for a store writing \"pk\": %v, want ErrTableSchema", "id", err)
	}
	if _, err := dynamo.New(ctx, dynamo.Config{Client: on, Table: other, Attributes: dynamo.AttributeNames{PartitionKey: "id"}}); err != nil {
		t.Errorf("the same table, PartitionKey \"id\": %v", err)
	}
	composite := "range_" + storekit.NewToken()[:8]
	if _, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName: aws.String(composite), BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String("pk"), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String("sk"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String("pk"), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String("sk"), KeyType: types.KeyTypeRange}},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := dynamo.New(ctx, dynamo.Config{Client: on, Table: composite}); !errors.Is(err, dynamo.ErrTableSchema) {
		t.Errorf("a sort key: %v, want ErrTableSchema", err)
	}

	for _, tc := range []struct {
		status    types.TimeToLiveStatus
		attribute string
	}{{types.TimeToLiveStatusDisabled, ""}, {types.TimeToLiveStatusEnabled, "expires_at"}} {
		c := &ttlAnswer{Client: client, status: tc.status, attribute: tc.attribute}
		_, err := dynamo.New(ctx, dynamo.Config{Client: c, Table: testTable})
		if !errors.Is(err, dynamo.ErrTTLDisabled) || !strings.Contains(err.Error(), "SkipTTL") {
			t.Errorf("TTL %s on %q: %v, want ErrTTLDisabled saying what to set", tc.status, tc.attribute, err)
		}
		if _, err := dynamo.New(ctx, dynamo.Config{Client: c, Table: testTable, SkipTTL: true}); err != nil {
			t.Errorf("TTL %s with SkipTTL: %v", tc.status, err)
		}
		if n := c.calls.Load(); n != 1 {
			t.Errorf("%d DescribeTimeToLive calls, want 1 (none with SkipTTL)", n)
		}
	}
	// dynalite itself has no DescribeTimeToLive: refused unless SkipTTL.
	if _, err := dynamo.New(ctx, dynamo.Config{Client: client, Table: testTable}); err == nil || !strings.Contains(err.Error(), "SkipTTL") {
		t.Errorf("a server without TTL: %v, want an error naming SkipTTL", err)
	}

	// No request at all: a client whose endpoint does not exist.
	dead := newClient("http://127.0.0.1:1", 1)
	if _, err := dynamo.New(ctx, dynamo.Config{Client: dead, Table: "whatever", SkipTableCheck: true}); err != nil {
		t.Errorf("SkipTableCheck: %v", err)
	}
}

// TestNewReportsAWSConfigFailures: credentials that cannot be retrieved,
// or no region, are an *AWSConfigError (ErrAWSConfig) saying which, not a
// DynamoDB that does not answer.
func TestNewReportsAWSConfigFailures(t *testing.T) {
	ctx := context.Background()
	noCreds := dynamodb.New(dynamodb.Options{Region: "us-east-1", BaseEndpoint: aws.String(endpoint), RetryMaxAttempts: 1,
		Credentials: aws.NewCredentialsCache(credentials.NewStaticCredentialsProvider("", "", ""))})
	noRegion := dynamodb.New(dynamodb.Options{RetryMaxAttempts: 1, // no endpoint either: AWS itself, which needs a region
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")})
	for name, tc := range map[string]struct {
		c    *dynamodb.Client
		what string
	}{"credentials": {noCreds, "credentials"}, "region": {noRegion, "region"}} {
		_, err := dynamo.New(ctx, dynamo.Config{Client: tc.c, Table: testTable, SkipTTL: true})
		var cfgErr *dynamo.AWSConfigError
		if !errors.Is(err, dynamo.ErrAWSConfig) || !errors.As(err, &cfgErr) || cfgErr.What != tc.what {
			t.Errorf("%s: %v, want an *AWSConfigError about %s", name, err, tc.what)
		}
	}
}
