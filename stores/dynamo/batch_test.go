package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/watermill-dedup/watermill-dedup/dedup"

	"github.com/watermill-dedup/watermill-dedup/dedup/storetest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

func batchFeatures(t *testing.T) storetest.Features {
	f := features(t)
	f.Batch, f.BatchRequestSize = true, dynamo.BatchConcurrency
	return f
}

// The batch cases on dynalite, a store of its own per case on a fake
// clock.
func TestBatchConformance(t *testing.T) {
	storetest.RunBatch(t, perCase(client, testTable, true), batchFeatures(t))
}

// The batch cases with every attribute named otherwise, on dynalite.
func TestBatchConformanceCustomAttributes(t *testing.T) {
	table, err := customTable()
	if err != nil {
		t.Fatal(err)
	}
	f := featuresOf(t, customAttributes)
	f.Batch, f.BatchRequestSize = true, dynamo.BatchConcurrency
	storetest.RunBatch(t, perCaseOf(dynamo.Config{Client: client, Table: table, Attributes: customAttributes}, true), f)
}

// The batch cases on moto, which returns the old item with a failed
// condition as DynamoDB does (skipped where moto_server is missing).
func TestBatchConformanceMoto(t *testing.T) {
	m, err := testserver.StartMoto()
	if errors.Is(err, testserver.ErrMotoMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	motoClient := newClient(m.Endpoint, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dynamo.CreateTable(ctx, motoClient, dynamo.TableConfig{Table: testTable}); err != nil {
		t.Fatalf("CreateTable on moto: %v", err)
	}
	storetest.RunBatch(t, perCase(motoClient, testTable, true), batchFeatures(t))
}

// throttlingClient answers the PutItem of the keys in throttle with a
// ProvisionedThroughputExceededException, as DynamoDB does for a hot
// partition, without sending it.
type throttlingClient struct {
	dynamo.Client
	throttle map[string]bool
}

func (c throttlingClient) PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	if pk, ok := in.Item[dynamo.DefaultPartitionKey].(*types.AttributeValueMemberS); ok && c.throttle[pk.Value] {
		return nil, &types.ProvisionedThroughputExceededException{Message: aws.String("throttled (test)")}
	}
	return c.Client.PutItem(ctx, in, opts...)
}

// TestBatchThrottledRecords: a batch whose claims of some records are
// throttled: those records get a store error and are not claimed (a later
// claim acquires them), the others are acquired; one record's failure
// changes no other's answer.
func TestBatchThrottledRecords(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("throttle-%d-", time.Now().UnixNano())
	throttle := map[string]bool{}
	var reqs []dedup.ClaimRequest
	for i := range 10 {
		key := fmt.Sprint(prefix, i)
		if i%3 == 1 {
			throttle[key] = true
		}
		reqs = append(reqs, dedup.ClaimRequest{Key: key, Lease: time.Minute})
	}
	s := newStore(t, dynamo.Config{Client: throttlingClient{Client: newClient(endpoint, 0), throttle: throttle}})
	res, errs := s.ClaimBatch(ctx, reqs)
	for i, r := range reqs {
		var pe *types.ProvisionedThroughputExceededException
		switch {
		case throttle[r.Key] && !errors.As(errs[i], &pe):
			t.Fatalf("record %d: %v, want the throttle's error", i, errs[i])
		case throttle[r.Key] && errors.Is(errs[i], dedup.ErrClaimLost):
			t.Fatalf("record %d: a throttle is a store error, not a lost claim: %v", i, errs[i])
		case !throttle[r.Key] && (errs[i] != nil || res[i].Outcome != dedup.Acquired):
			t.Fatalf("record %d: %v %v, want acquired", i, res[i].Outcome, errs[i])
		}
	}
	plain := newStore(t, dynamo.Config{})
	for key := range throttle { // nothing was claimed under them
		if r, err := plain.Claim(ctx, key, "", time.Minute); err != nil || r.Outcome != dedup.Acquired {
			t.Fatalf("Claim(%q) = %v, %v; want acquired", key, r.Outcome, err)
		}
	}
}
