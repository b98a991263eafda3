package reliability_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// storeKind opens stores of one backend for a scenario: each call of open
// gives a store with a client (and connection pool) of its own, as a
// separate consumer process would have; recordState reads a scoped key's
// record straight from the backend.
type storeKind struct {
	name  string
	setup func(t *testing.T) (open func() dedup.Store, recordState func(scopedKey string) string)
}

var storeKinds = []storeKind{
	{name: "memory", setup: func(t *testing.T) (func() dedup.Store, func(string) string) {
		// One process: the routers share the store (the MemoryStore only
		// deduplicates within a process), each has its own Deduplicator.
		shared := memstore.New(nil)
		return func() dedup.Store { return shared }, func(key string) string {
			// The only way into a MemoryStore is its API; at the end of a
			// run a Claim does not change a completed record.
			res, err := shared.Claim(context.Background(), key, "", time.Minute)
			if err != nil {
				return "error: " + err.Error()
			}
			return map[dedup.Outcome]string{dedup.Duplicate: "completed", dedup.InProgress: "in_progress", dedup.Acquired: "absent"}[res.Outcome]
		}
	}},
	redisKind("redis", false),
	redisKind("redis-autopipeline", true),
	{name: "dynamodb", setup: func(t *testing.T) (func() dedup.Store, func(string) string) {
		admin := newDynamoClient(dynamoEndpoint)
		return func() dedup.Store {
				s, err := dynamo.New(context.Background(), dynamo.Config{Client: newDynamoClient(dynamoEndpoint), Table: dynamoTable, SkipTTL: true})
				if err != nil {
					t.Fatalf("dynamo.New: %v", err)
				}
				return s
			}, func(key string) string {
				pk, err := dynamo.PartitionKey(key)
				if err != nil {
					return "error: " + err.Error()
				}
				out, err := admin.GetItem(context.Background(), &dynamodb.GetItemInput{
					TableName:      aws.String(dynamoTable),
					Key:            map[string]types.AttributeValue{dynamo.DefaultPartitionKey: &types.AttributeValueMemberS{Value: pk}},
					ConsistentRead: aws.Bool(true),
				})
				if err != nil {
					return "error: " + err.Error()
				}
				if out.Item == nil {
					return "absent"
				}
				if s, ok := out.Item[dynamo.DefaultStateAttribute].(*types.AttributeValueMemberS); ok {
					return s.Value
				}
				return "unknown"
			}
	}},
}

// redisKind is the Redis backend of storeKinds, with or without
// Config.AutoPipeline.
func redisKind(name string, autoPipeline bool) storeKind {
	return storeKind{name: name, setup: func(t *testing.T) (func() dedup.Store, func(string) string) {
		prefix := uniquePrefix("concurrency")
		admin := newRedisClient(t, redisServer.Addr)
		return func() dedup.Store {
				return newRedisStore(t, newRedisClient(t, redisServer.Addr), prefix, autoPipeline)
			}, func(key string) string {
				v, err := admin.Get(context.Background(), prefix+key).Bytes()
				switch {
				case errors.Is(err, goredis.Nil):
					return "absent"
				case err != nil:
					return "error: " + err.Error()
				case redisRecordState(v) == 'C':
					return "completed"
				case redisRecordState(v) == 'P':
					return "in_progress"
				}
				return "unknown"
			}
	}}
}
