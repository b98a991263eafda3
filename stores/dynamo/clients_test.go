package dynamo_test

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// allOldClient wraps the real dynalite client and gives it the one
// behaviour of real DynamoDB that dynalite lacks: when a PutItem or
// UpdateItem asking for ReturnValuesOnConditionCheckFailure=ALL_OLD fails
// its condition, the ConditionalCheckFailedException carries the existing
// item. The wrapper reads that item itself (with the inner client, so it
// is not counted) and attaches it to the exception. Every request still
// goes to the server.
type allOldClient struct {
	dynamo.Client
	pk        string
	attached  atomic.Int64 // failed writes that got their old item attached
	storeGets atomic.Int64 // GetItem calls made by the store
}

func (c *allOldClient) PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	out, err := c.Client.PutItem(ctx, in, opts...)
	return out, c.attach(ctx, err, in.TableName, in.Item[c.pk], in.ReturnValuesOnConditionCheckFailure)
}

func (c *allOldClient) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	out, err := c.Client.UpdateItem(ctx, in, opts...)
	return out, c.attach(ctx, err, in.TableName, in.Key[c.pk], in.ReturnValuesOnConditionCheckFailure)
}

// attach attaches the item under pk to err, a failed condition of a write
// that asked for ALL_OLD.
func (c *allOldClient) attach(ctx context.Context, err error, table *string, pk types.AttributeValue, rv types.ReturnValuesOnConditionCheckFailure) error {
	var failed *types.ConditionalCheckFailedException
	if err == nil || !errors.As(err, &failed) || rv != types.ReturnValuesOnConditionCheckFailureAllOld {
		return err
	}
	got, gerr := c.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      table,
		Key:            map[string]types.AttributeValue{c.pk: pk},
		ConsistentRead: aws.Bool(true),
	})
	if gerr != nil {
		return gerr
	}
	if len(got.Item) > 0 {
		failed.Item = got.Item
		c.attached.Add(1)
	}
	return err
}

func (c *allOldClient) GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	c.storeGets.Add(1)
	return c.Client.GetItem(ctx, in, opts...)
}

// hookClient wraps the real client, counts calls and lets a test run code
// around PutItem, UpdateItem and GetItem (to interleave another writer, or
// to repeat a request as an SDK retry after a lost response would).
type hookClient struct {
	dynamo.Client
	puts, updates, gets atomic.Int64
	// afterPut, if set, runs after every PutItem and may replace its result.
	afterPut func(ctx context.Context, in *dynamodb.PutItemInput, out *dynamodb.PutItemOutput, err error) (*dynamodb.PutItemOutput, error)
	// afterUpdate, if set, runs after every UpdateItem and may replace its
	// result.
	afterUpdate func(ctx context.Context, in *dynamodb.UpdateItemInput, out *dynamodb.UpdateItemOutput, err error) (*dynamodb.UpdateItemOutput, error)
	// getItem, if set, replaces GetItem.
	getItem func(ctx context.Context, in *dynamodb.GetItemInput) (*dynamodb.GetItemOutput, error)
}

func (c *hookClient) PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	c.puts.Add(1)
	out, err := c.Client.PutItem(ctx, in, opts...)
	if c.afterPut != nil {
		return c.afterPut(ctx, in, out, err)
	}
	return out, err
}

func (c *hookClient) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	c.updates.Add(1)
	out, err := c.Client.UpdateItem(ctx, in, opts...)
	if c.afterUpdate != nil {
		return c.afterUpdate(ctx, in, out, err)
	}
	return out, err
}

func (c *hookClient) GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	c.gets.Add(1)
	if c.getItem != nil {
		return c.getItem(ctx, in)
	}
	return c.Client.GetItem(ctx, in, opts...)
}
