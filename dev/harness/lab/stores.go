package lab

import (
	"context"
	"errors"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// DynamoStore returns a DynamoDB store on table, creating the table when it
// does not exist (on-demand billing; TTL enabled where the server supports
// it, which dynalite does not: the store never relies on TTL). Cost: one
// CreateTable call, plus one UpdateTimeToLive when it created the table.
func DynamoStore(ctx context.Context, client *dynamodb.Client, table string) (*dynamo.Store, error) {
	err := dynamo.CreateTable(ctx, client, dynamo.TableConfig{Table: table, SkipTTL: true})
	var inUse *types.ResourceInUseException
	switch {
	case err == nil:
		// Best effort: TTL only frees storage, and emulators lack it.
		_ = dynamo.EnableTTL(ctx, client, table, dynamo.DefaultTTLAttribute)
	case errors.As(err, &inUse):
		// The table exists.
	default:
		return nil, err
	}
	// SkipTTL: the lab's table is its own, TTL is best effort above.
	return dynamo.New(ctx, dynamo.Config{Client: client, Table: table, SkipTTL: true})
}
