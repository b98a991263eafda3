package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/watermill-dedup/watermill-dedup/dedup"
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

// replicasAnswer forwards everything to dynalite, which has no global
// tables, except that DescribeTable's answer gets the replicas, witnesses
// and consistency mode of a global table (as DynamoDB describes one), and
// DescribeTimeToLive answers ttl.
type replicasAnswer struct {
	*dynamodb.Client
	replicas    []string
	witness     string
	consistency types.MultiRegionConsistency
	ttl         types.TimeToLiveStatus
}

func (c *replicasAnswer) DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error) {
	out, err := c.Client.DescribeTable(ctx, in, opts...)
	if err != nil {
		return nil, err
	}
	t := *out.Table
	for _, r := range c.replicas {
		t.Replicas = append(t.Replicas, types.ReplicaDescription{RegionName: aws.String(r), ReplicaStatus: types.ReplicaStatusActive})
	}
	if c.witness != "" {
		t.GlobalTableWitnesses = []types.GlobalTableWitnessDescription{{RegionName: aws.String(c.witness), WitnessStatus: types.WitnessStatusActive}}
	}
	if len(c.replicas) > 0 {
		t.GlobalTableVersion = aws.String("2019.11.21")
	}
	t.MultiRegionConsistency = c.consistency
	return &dynamodb.DescribeTableOutput{Table: &t}, nil
}

func (c *replicasAnswer) DescribeTimeToLive(context.Context, *dynamodb.DescribeTimeToLiveInput, ...func(*dynamodb.Options)) (*dynamodb.DescribeTimeToLiveOutput, error) {
	return &dynamodb.DescribeTimeToLiveOutput{TimeToLiveDescription: &types.TimeToLiveDescription{
		TimeToLiveStatus: c.ttl, AttributeName: aws.String(dynamo.DefaultTTLAttribute)}}, nil
}

// TestNewRefusesEventuallyConsistentReplicas: a global table replicated
// with multi-Region eventual consistency (MREC), where two Regions'
// conditional writes can both succeed, is refused at New with a
// *ReplicasError naming the Regions and the option, unless
// AllowEventuallyConsistentReplicas; a single-Region table, and a global
// table with multi-Region strong consistency (MRSC), are accepted. The
// global tables are DescribeTable answers made up after DynamoDB's
// (neither dynalite nor moto 5.2.1 has global tables: moto accepts
// UpdateTable's ReplicaUpdates and MultiRegionConsistency and ignores
// them).
func TestNewRefusesEventuallyConsistentReplicas(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		answer replicasAnswer
		allow  bool
		refuse bool
	}{
		{name: "MREC, consistency not reported", answer: replicasAnswer{replicas: []string{"us-east-1", "eu-west-1"}}, refuse: true},
		{name: "MREC", answer: replicasAnswer{replicas: []string{"us-east-1", "eu-west-1"}, consistency: types.MultiRegionConsistencyEventual}, refuse: true},
		{name: "MREC, allowed", answer: replicasAnswer{replicas: []string{"us-east-1", "eu-west-1"}}, allow: true},
		{name: "MRSC, three replicas", answer: replicasAnswer{replicas: []string{"us-east-1", "us-east-2", "us-west-2"}, consistency: types.MultiRegionConsistencyStrong}},
		{name: "MRSC, a witness", answer: replicasAnswer{replicas: []string{"us-east-1", "us-east-2"}, witness: "us-west-2", consistency: types.MultiRegionConsistencyStrong}},
		{name: "a witness, consistency not reported", answer: replicasAnswer{replicas: []string{"us-east-1", "us-east-2"}, witness: "us-west-2"}},
		{name: "one Region, a consistency mode reported", answer: replicasAnswer{consistency: types.MultiRegionConsistencyEventual}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.answer
			c.Client, c.ttl = client, types.TimeToLiveStatusEnabled
			s, err := dynamo.New(ctx, dynamo.Config{Client: &c, Table: testTable, SkipTTL: tc.answer.consistency == types.MultiRegionConsistencyStrong || tc.answer.witness != "",
				AllowEventuallyConsistentReplicas: tc.allow})
			if !tc.refuse {
				if err != nil || s == nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			var re *dynamo.ReplicasError
			if !errors.Is(err, dynamo.ErrEventuallyConsistentReplicas) || !errors.As(err, &re) || s != nil {
				t.Fatalf("New: %v, want a *ReplicasError matching ErrEventuallyConsistentReplicas", err)
			}
			if re.Table != testTable || fmt.Sprint(re.Regions) != fmt.Sprint(tc.answer.replicas) {
				t.Errorf("ReplicasError %+v, want table %q and Regions %v", re, testTable, tc.answer.replicas)
			}
			for _, want := range []string{"AllowEventuallyConsistentReplicas", "strong consistency", "us-east-1, eu-west-1"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error does not say %q: %v", want, err)
				}
			}
			// SkipTableCheck looks at nothing, replicas included.
			if _, err := dynamo.New(ctx, dynamo.Config{Client: &c, Table: testTable, SkipTableCheck: true}); err != nil {
				t.Errorf("SkipTableCheck: %v", err)
			}
		})
	}
}

// TestStronglyConsistentReplicas: DynamoDB gives a global table with
// multi-Region strong consistency (MRSC) neither Time to Live nor
// transactions. New without SkipTTL refuses it with ErrTTLDisabled saying
// so; with SkipTTL the store claims as anywhere, and RunInTx refuses to
// start (ErrNoTransactions) before its work runs, instead of failing the
// transaction after the effect's work.
func TestStronglyConsistentReplicas(t *testing.T) {
	ctx := context.Background()
	c := &replicasAnswer{Client: client, replicas: []string{"us-east-1", "us-east-2"}, witness: "us-west-2",
		consistency: types.MultiRegionConsistencyStrong, ttl: types.TimeToLiveStatusDisabled}
	_, err := dynamo.New(ctx, dynamo.Config{Client: c, Table: testTable})
	if !errors.Is(err, dynamo.ErrTTLDisabled) || !strings.Contains(err.Error(), "strong consistency") || !strings.Contains(err.Error(), "SkipTTL") {
		t.Fatalf("New of an MRSC table without SkipTTL: %v, want ErrTTLDisabled explaining that MRSC has no TTL", err)
	}
	s, err := dynamo.New(ctx, dynamo.Config{Client: c, Table: testTable, SkipTTL: true})
	if err != nil {
		t.Fatalf("New of an MRSC table with SkipTTL: %v", err)
	}
	e := newTxEngine(t, s)
	ran := false
	res, err := e.Do(ctx, dedup.Call{Scope: "mrsc-" + storekit.NewToken()[:8], Key: "k"}, func(ctx context.Context) ([]byte, error) {
		return s.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
			ran = true
			return nil, nil
		})
	})
	if !errors.Is(err, dynamo.ErrNoTransactions) || !strings.Contains(err.Error(), "strong consistency") {
		t.Fatalf("RunInTx on an MRSC table: %v, %v; want ErrNoTransactions", res.Outcome, err)
	}
	if ran {
		t.Fatal("RunInTx ran its work on a table without transactions")
	}
}
