package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/internal/keys"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// TxCharges writes the lab's charges to the dedup store's own database, in
// the transaction that completes each order's record (Config.TxCharges).
type TxCharges interface {
	// Middleware is the store's TxMiddleware, added inside the dedup
	// middleware.
	Middleware(h message.HandlerFunc) message.HandlerFunc
	// Charge adds the charge of order to the transaction of msg's
	// handler (scope is the run's dedup scope).
	Charge(msg *message.Message, scope, order string) error
	// Table reads how many times each of orders was charged in the run of
	// scope.
	Table(ctx context.Context, scope string, orders []string) (map[string]int, error)
	// Where names the charges table, for the output.
	Where() string
}

// redisCharges counts each order's charges under a key in the slot of the
// order's record (Tx.HashTag), so it works on a Cluster too.
type redisCharges struct {
	store  *dedupredis.Store
	client goredis.UniversalClient
}

// RedisTxCharges charges with INCR queued on the record's script
// (stores/redis TxMiddleware).
func RedisTxCharges(store *dedupredis.Store, client goredis.UniversalClient) TxCharges {
	return &redisCharges{store: store, client: client}
}

func (c *redisCharges) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return c.store.TxMiddleware(h)
}

func (c *redisCharges) Charge(msg *message.Message, _, _ string) error {
	tx, ok := dedupredis.TxFromContext(msg.Context())
	if !ok {
		return errors.New("lab: no Redis transaction in the handler's context")
	}
	k := tx.HashTag() + ":charged"
	_, err := tx.Queue([]string{k}, "incr", k)
	return err
}

// key is the charge key of order: what Tx.HashTag gives for a record key
// without braces.
func (c *redisCharges) key(scope, order string) string {
	return "{" + c.store.RedisKey(keys.Scoped(scope, order)) + "}:charged"
}

func (c *redisCharges) Table(ctx context.Context, scope string, orders []string) (map[string]int, error) {
	cmds := make([]*goredis.StringCmd, len(orders))
	_, err := c.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, o := range orders {
			cmds[i] = p.Get(ctx, c.key(scope, o))
		}
		return nil
	})
	if err != nil && !errors.Is(err, goredis.Nil) {
		return nil, fmt.Errorf("lab: reading the charges: %w", err)
	}
	table := make(map[string]int, len(orders))
	for i, o := range orders {
		n, err := cmds[i].Int()
		if err != nil && !errors.Is(err, goredis.Nil) {
			return nil, fmt.Errorf("lab: reading the charge of %s: %w", o, err)
		}
		table[o] = n
	}
	return table, nil
}

func (c *redisCharges) Where() string {
	return "Redis keys {<record key>}:charged, INCR run by the script that completes the record"
}

// dynamoCharges keeps the charges in a table of their own, one item per
// run and order, its charges attribute counting them.
type dynamoCharges struct {
	store  *dynamo.Store
	client *dynamodb.Client
	table  string
}

// DynamoTxCharges charges with an UpdateItem (ADD charges 1) in the
// TransactWriteItems that completes the record (stores/dynamo
// TxMiddleware), on table, which it creates when missing. It checks that
// the server has transactions (dynalite has none) with a ConditionCheck
// that writes nothing. Cost: a CreateTable, a TransactWriteItems.
func DynamoTxCharges(ctx context.Context, store *dynamo.Store, client *dynamodb.Client, table string) (TxCharges, error) {
	err := dynamo.CreateTable(ctx, client, dynamo.TableConfig{Table: table, SkipTTL: true})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return nil, err
	}
	_, err = client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{{
		ConditionCheck: &types.ConditionCheck{
			TableName:           aws.String(table),
			Key:                 map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "dedup-lab-probe"}},
			ConditionExpression: aws.String("attribute_not_exists(pk)"),
		},
	}}})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dynamo.ErrNoTransactions, err)
	}
	return &dynamoCharges{store: store, client: client, table: table}, nil
}

func (c *dynamoCharges) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return c.store.TxMiddleware(h)
}

func (c *dynamoCharges) key(scope, order string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: scope + "/" + order}}
}

func (c *dynamoCharges) Charge(msg *message.Message, scope, order string) error {
	tx, ok := dynamo.TxFromContext(msg.Context())
	if !ok {
		return errors.New("lab: no DynamoDB transaction in the handler's context")
	}
	return tx.Add(types.TransactWriteItem{Update: &types.Update{
		TableName:                 aws.String(c.table),
		Key:                       c.key(scope, order),
		UpdateExpression:          aws.String("ADD charges :one"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}},
	}})
}

func (c *dynamoCharges) Table(ctx context.Context, scope string, orders []string) (map[string]int, error) {
	table := make(map[string]int, len(orders))
	for _, o := range orders {
		out, err := c.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(c.table), Key: c.key(scope, o), ConsistentRead: aws.Bool(true)})
		if err != nil {
			return nil, fmt.Errorf("lab: reading the charge of %s: %w", o, err)
		}
		n := 0
		if v, ok := out.Item["charges"].(*types.AttributeValueMemberN); ok {
			if n, err = strconv.Atoi(v.Value); err != nil {
				return nil, fmt.Errorf("lab: the charge of %s: %w", o, err)
			}
		}
		table[o] = n
	}
	return table, nil
}

func (c *dynamoCharges) Where() string {
	return "DynamoDB table " + c.table + ", UpdateItem ADD charges 1 in the TransactWriteItems that completes the record"
}

// PrintCharges writes the charges table of each run that has one: the
// first rows (ORDER-003 first), then how many orders were charged how many
// times.
func PrintCharges(w io.Writer, where string, results []Result) {
	for _, r := range results {
		if r.Table == nil {
			continue
		}
		orders := make([]string, 0, len(r.Table))
		for o := range r.Table {
			orders = append(orders, o)
		}
		sort.Slice(orders, func(i, j int) bool {
			if (orders[i] == "ORDER-003") != (orders[j] == "ORDER-003") {
				return orders[i] == "ORDER-003"
			}
			return orders[i] < orders[j]
		})
		fmt.Fprintf(w, "\ncharges table (%s):\n", where)
		fmt.Fprintf(w, "  %-12s %7s\n", "order", "charges")
		const rows = 5
		byCount := map[int]int{}
		for i, o := range orders {
			byCount[r.Table[o]]++
			if i < rows {
				fmt.Fprintf(w, "  %-12s %7d\n", o, r.Table[o])
			}
		}
		if len(orders) > rows {
			fmt.Fprintf(w, "  ... %d more orders\n", len(orders)-rows)
		}
		counts := make([]int, 0, len(byCount))
		for n := range byCount {
			counts = append(counts, n)
		}
		sort.Ints(counts)
		for _, n := range counts {
			fmt.Fprintf(w, "  %d orders charged %d time(s)\n", byCount[n], n)
		}
	}
}
