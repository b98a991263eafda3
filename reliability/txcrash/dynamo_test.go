package txcrash

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// dynamoClient is a client of the endpoint with static credentials.
func dynamoClient(endpoint string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(endpoint),
		HTTPClient: awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
			t.Proxy = nil
			t.MaxIdleConnsPerHost = workers
		}),
	})
}

// tables are a test's records table and its charges table (the effect:
// one item per order, its n attribute counting the charges).
func tables(t *testing.T) (records, charges string) {
	n := strings.ReplaceAll(runName(t), "/", "-")
	return n + "-records", n + "-charges"
}

// dynamoConsumer runs each message through Engine.Do; the effect is an
// UpdateItem ADD n 1 of the order's charge item, added to the record's
// transaction (RunInTx) or sent by the work itself.
type dynamoConsumer struct {
	e       *dedup.Engine
	store   *dynamo.Store
	client  *dynamodb.Client
	charges string
	helper  bool
}

func newDynamoConsumer(t *testing.T) func(endpoint string, helper bool) (consumer, error) {
	return func(endpoint string, helper bool) (consumer, error) {
		records, charges := tables(t)
		client := dynamoClient(endpoint)
		store, err := dynamo.New(context.Background(), dynamo.Config{Client: client, Table: records, ClockSkewMargin: 50 * time.Millisecond})
		if err != nil {
			return nil, err
		}
		e, err := dedup.NewEngine(dedup.Config{Store: store, Lease: lease})
		if err != nil {
			return nil, err
		}
		return &dynamoConsumer{e: e, store: store, client: client, charges: charges, helper: helper}, nil
	}
}

func (c *dynamoConsumer) charge(order string) *types.Update {
	return &types.Update{
		TableName:                 aws.String(c.charges),
		Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: order}},
		UpdateExpression:          aws.String("ADD n :one"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}},
	}
}

func (c *dynamoConsumer) handle(ctx context.Context, i int) error {
	order := keyName(i)
	_, err := c.e.Do(ctx, dedup.Call{Scope: scope, Key: order}, func(ctx context.Context) ([]byte, error) {
		if !c.helper {
			u := c.charge(order)
			_, err := c.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: u.TableName, Key: u.Key,
				UpdateExpression: u.UpdateExpression, ExpressionAttributeValues: u.ExpressionAttributeValues})
			return nil, err
		}
		return c.store.RunInTx(ctx, func(ctx context.Context) ([]byte, error) {
			tx, ok := dynamo.TxFromContext(ctx)
			if !ok {
				return nil, fmt.Errorf("no transaction")
			}
			return nil, tx.Add(types.TransactWriteItem{Update: c.charge(order)})
		})
	})
	return err
}

// motoBackend creates the test's tables on moto and returns the parent's
// view of them.
func motoBackend(t *testing.T) backend {
	if motoSkip != nil {
		t.Skip(motoSkip)
	}
	records, charges := tables(t)
	client := dynamoClient(motoEndpoint)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, table := range []string{records, charges} {
		if err := dynamo.CreateTable(ctx, client, dynamo.TableConfig{Table: table}); err != nil {
			t.Fatalf("CreateTable %s: %v", table, err)
		}
	}
	store, err := dynamo.New(ctx, dynamo.Config{Client: client, Table: records, ClockSkewMargin: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Fewer keys than on Redis: moto serves one request at a time, and
	// the last child must get through every key left within
	// crashtest.WaitTimeout also beside the rest of the suite and other
	// CPU-bound processes (with 1000 it once did not).
	const keys = 500
	return backend{
		name: "dynamodb (moto)", keys: keys, store: store,
		env: []string{envAddr + "=" + motoEndpoint},
		effects: func(t *testing.T) []int {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			n := make([]int, keys)
			p := dynamodb.NewScanPaginator(client, &dynamodb.ScanInput{TableName: aws.String(charges), ConsistentRead: aws.Bool(true)})
			for p.HasMorePages() {
				page, err := p.NextPage(ctx)
				if err != nil {
					t.Fatalf("reading the effects: %v", err)
				}
				for _, item := range page.Items {
					pk, _ := item["pk"].(*types.AttributeValueMemberS)
					v, _ := item["n"].(*types.AttributeValueMemberN)
					if pk == nil || v == nil {
						t.Fatalf("a malformed charge item: %v", item)
					}
					i, err := strconv.Atoi(strings.TrimPrefix(pk.Value, "order-"))
					if err != nil || i < 0 || i >= keys {
						t.Fatalf("a charge item of an unknown order: %q", pk.Value)
					}
					if n[i], err = strconv.Atoi(v.Value); err != nil {
						t.Fatal(err)
					}
				}
			}
			return n
		},
	}
}

// moto runs TransactWriteItems one item after another; testserver serves
// it one request at a time, so no other request sees a transaction half
// done (what DynamoDB guarantees by itself). A kill of the client cannot
// cut a request the server has received in half either way.
func TestMotoHelper(t *testing.T) {
	if childMain(t, newDynamoConsumer(t)) {
		return
	}
	checkHelper(t, motoBackend(t))
}

func TestMotoWithoutHelper(t *testing.T) {
	if childMain(t, newDynamoConsumer(t)) {
		return
	}
	checkWithout(t, motoBackend(t))
}

// dynalite, the DynamoDB emulator of the other tests, has no
// TransactWriteItems: the helper cannot run there (RunInTx returns
// dynamo.ErrNoTransactions, see stores/dynamo TestRunInTxDynalite).
