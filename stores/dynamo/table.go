package dynamo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// DefaultTableWait is how long CreateTable waits for a new table to become
// ACTIVE when TableConfig.Wait is zero.
const DefaultTableWait = 2 * time.Minute

// TableConfig describes the table CreateTable makes.
type TableConfig struct {
	// Table is the table name. Required.
	Table string

	// PartitionKey is the name of the string partition key. Defaults to
	// "pk"; must match Config.Attributes.PartitionKey.
	PartitionKey string

	// TTLAttribute is the attribute DynamoDB TTL deletes expired items by.
	// Defaults to "ttl"; must match Config.Attributes.TTL.
	TTLAttribute string

	// SkipTTL leaves Time to Live disabled. Set it only for servers that
	// have no UpdateTimeToLive operation, such as dynalite: expired records
	// are then never deleted (the store still treats them as absent), so
	// storage grows. Defaults to false.
	SkipTTL bool

	// Wait bounds the wait for the table to become ACTIVE. Defaults to
	// DefaultTableWait.
	Wait time.Duration
}

// CreateTable creates a table for the store, for local development and
// tests: on-demand (PAY_PER_REQUEST) billing, a string partition key and no
// sort key; it waits until the table is ACTIVE and then enables TTL on
// TTLAttribute (unless SkipTTL). In production, prefer infrastructure as
// code (see the README's CloudFormation snippet).
//
// An existing table is an error matching *types.ResourceInUseException
// (errors.As). If the table was created but enabling TTL failed, the error
// says so; call EnableTTL again or set SkipTTL. Cost: one CreateTable, a
// DescribeTable per poll, one UpdateTimeToLive.
func CreateTable(ctx context.Context, client TableClient, config TableConfig) error {
	if config.Table == "" {
		return errors.New("dynamo: TableConfig.Table is required")
	}
	if config.PartitionKey == "" {
		config.PartitionKey = DefaultPartitionKey
	}
	if config.TTLAttribute == "" {
		config.TTLAttribute = DefaultTTLAttribute
	}
	if config.Wait == 0 {
		config.Wait = DefaultTableWait
	}
	if config.Wait < 0 {
		return fmt.Errorf("dynamo: TableConfig.Wait must not be negative, got %v", config.Wait)
	}
	_, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:   aws.String(config.Table),
		BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(config.PartitionKey), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(config.PartitionKey), KeyType: types.KeyTypeHash},
		},
	})
	if err != nil {
		return fmt.Errorf("dynamo: CreateTable %q: %w", config.Table, err)
	}
	waiter := dynamodb.NewTableExistsWaiter(client, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay = 100 * time.Millisecond
		o.MaxDelay = 5 * time.Second
	})
	if err := waiter.Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(config.Table)}, config.Wait); err != nil {
		return fmt.Errorf("dynamo: waiting for table %q to become active: %w", config.Table, err)
	}
	if config.SkipTTL {
		return nil
	}
	if err := EnableTTL(ctx, client, config.Table, config.TTLAttribute); err != nil {
		return fmt.Errorf("table %q was created, but TTL is not enabled (call EnableTTL again, or set TableConfig.SkipTTL for servers without TTL): %w", config.Table, err)
	}
	return nil
}

// EnableTTL turns on DynamoDB Time to Live for table on attribute, so that
// records are deleted some time (up to a few days) after their TTL epoch
// second. It is for storage cost only: the store never relies on it. Cost:
// one round trip; DynamoDB allows one TTL change per table per hour.
func EnableTTL(ctx context.Context, client TableClient, table, attribute string) error {
	_, err := client.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName: aws.String(table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(attribute),
			Enabled:       aws.Bool(true),
		},
	})
	if err != nil {
		return fmt.Errorf("dynamo: enabling TTL on %q of table %q: %w", attribute, table, err)
	}
	return nil
}
