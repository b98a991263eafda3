package dynamo_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// ttlRecorder forwards everything to dynalite except UpdateTimeToLive,
// which dynalite does not implement: it records the request instead.
type ttlRecorder struct {
	*dynamodb.Client
	got []*dynamodb.UpdateTimeToLiveInput
}

func (r *ttlRecorder) UpdateTimeToLive(_ context.Context, in *dynamodb.UpdateTimeToLiveInput, _ ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error) {
	r.got = append(r.got, in)
	return &dynamodb.UpdateTimeToLiveOutput{}, nil
}

func TestCreateTable(t *testing.T) {
	ctx := context.Background()
	name := "create_" + storekit.NewToken()[:12]
	rec := &ttlRecorder{Client: client}
	if err := dynamo.CreateTable(ctx, rec, dynamo.TableConfig{Table: name, PartitionKey: "id", TTLAttribute: "expires_at"}); err != nil {
		t.Fatalf("CreateTable: %v", err)
	}
	out, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	d := out.Table
	if d.TableStatus != types.TableStatusActive {
		t.Errorf("status = %v, want ACTIVE", d.TableStatus)
	}
	if d.BillingModeSummary == nil || d.BillingModeSummary.BillingMode != types.BillingModePayPerRequest {
		t.Errorf("billing = %+v, want PAY_PER_REQUEST", d.BillingModeSummary)
	}
	if len(d.KeySchema) != 1 || aws.ToString(d.KeySchema[0].AttributeName) != "id" || d.KeySchema[0].KeyType != types.KeyTypeHash {
		t.Errorf("key schema = %+v, want a single hash key \"id\"", d.KeySchema)
	}
	if len(rec.got) != 1 || aws.ToString(rec.got[0].TableName) != name ||
		aws.ToString(rec.got[0].TimeToLiveSpecification.AttributeName) != "expires_at" ||
		!aws.ToBool(rec.got[0].TimeToLiveSpecification.Enabled) {
		t.Errorf("UpdateTimeToLive requests = %+v, want one enabling expires_at on %s", rec.got, name)
	}

	// The table works with a store using the same names.
	s := newStore(t, dynamo.Config{Table: name, Attributes: dynamo.AttributeNames{PartitionKey: "id", TTL: "expires_at"}})
	if _, err := s.Claim(ctx, "k", "", 60e9); err != nil {
		t.Fatalf("Claim on the new table: %v", err)
	}

	err = dynamo.CreateTable(ctx, client, dynamo.TableConfig{Table: name, SkipTTL: true})
	var inUse *types.ResourceInUseException
	if !errors.As(err, &inUse) {
		t.Fatalf("second CreateTable = %v, want *types.ResourceInUseException", err)
	}
}

// Against dynalite, which has no UpdateTimeToLive, CreateTable creates the
// table and then says that TTL is not enabled, keeping the server's error.
func TestCreateTableReportsMissingTTL(t *testing.T) {
	ctx := context.Background()
	name := "nottl_" + storekit.NewToken()[:12]
	err := dynamo.CreateTable(ctx, client, dynamo.TableConfig{Table: name})
	var apiErr smithy.APIError
	if err == nil || !errors.As(err, &apiErr) || !strings.Contains(err.Error(), "SkipTTL") {
		t.Fatalf("CreateTable on dynalite = %v, want the UpdateTimeToLive error and a hint", err)
	}
	if _, derr := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)}); derr != nil {
		t.Fatalf("the table was not created: %v", derr)
	}
}
