package dynamo

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// Client is the part of the DynamoDB API the store uses, with the SDK's own
// method signatures, so *dynamodb.Client satisfies it unchanged. Wrap it to
// add tracing, metrics or fault injection; the store never type-asserts it.
//
// Claim issues one PutItem conditioned on attribute_not_exists(pk); only a
// record found no longer live costs a second, conditional takeover write
// (an UpdateItem for a released or abandoned record, a PutItem after a
// completed record's retention), plus one strongly consistent GetItem when
// a failed condition comes back without the old item (some
// DynamoDB-compatible servers ignore ReturnValuesOnConditionCheckFailure). Complete, Extend and
// Release issue one UpdateItem each; admin's Evict one DeleteItem. New
// checks the table once with DescribeTable and DescribeTimeToLive (see
// Config.SkipTableCheck, Config.SkipTTL).
type Client interface {
	PutItem(ctx context.Context, params *dynamodb.PutItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	GetItem(ctx context.Context, params *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	UpdateItem(ctx context.Context, params *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(ctx context.Context, params *dynamodb.DeleteItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	DescribeTable(ctx context.Context, params *dynamodb.DescribeTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	DescribeTimeToLive(ctx context.Context, params *dynamodb.DescribeTimeToLiveInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTimeToLiveOutput, error)
}

// TableClient is the part of the DynamoDB API that [CreateTable] and
// [EnableTTL] use; *dynamodb.Client satisfies it.
type TableClient interface {
	CreateTable(ctx context.Context, params *dynamodb.CreateTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, params *dynamodb.DescribeTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	UpdateTimeToLive(ctx context.Context, params *dynamodb.UpdateTimeToLiveInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

var (
	_ Client      = (*dynamodb.Client)(nil)
	_ TableClient = (*dynamodb.Client)(nil)
)
