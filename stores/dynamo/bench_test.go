package dynamo_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// BenchmarkThroughput measures, in one run, at concurrency 1 and 16, on the
// same dynalite and table, with distinct keys throughout:
//
//   - put: a raw conditional PutItem (attribute_not_exists) of an item of
//     the store's shape: the floor of one round trip (baseline);
//   - put-claim-cond: the same raw PutItem with the claim's condition
//     (attribute_not_exists OR deadline <), built once: what the server
//     charges for the longer condition, without the store's client code;
//   - claim: Store.Claim of a fresh key (one conditional PutItem);
//   - put+update: the raw PutItem, then a raw conditional UpdateItem of
//     Complete's shape: the floor of the happy path's two round trips;
//   - middleware: the middleware's full happy path for a new message
//     (Claim, a no-op handler with the heartbeat armed, Complete: two round
//     trips).
//
// The modes run interleaved, in throughputRounds rounds of
// throughputSlice each (after a discarded warm-up round), so that the
// noise of a shared machine spreads evenly over them; it prints each
// mode's ops/s and its ratio to the baseline at the same concurrency, and
// reports the ratios as metrics. Run:
//
//	go test -run '^$' -bench Throughput ./stores/dynamo/
func BenchmarkThroughput(b *testing.B) {
	type mode struct {
		name string
		op   func(b *testing.B, prefix string) func(ctx context.Context, i int64) error
	}
	modes := []mode{
		{"put", benchPut},
		{"put-claim-cond", benchPutClaimCondition},
		{"claim", benchClaim},
		{"put+update", benchPutUpdate},
		{"middleware", benchMiddleware},
	}
	concurrencies := []int{1, 16}
	type total struct {
		ops     int64
		elapsed time.Duration
	}
	totals := map[string]*total{}
	for range b.N {
		for _, c := range concurrencies {
			for round := range throughputRounds + 1 {
				for j := range modes {
					m := modes[(j+round)%len(modes)] // rotate the order too
					op := m.op(b, "bench-"+storekit.NewToken()[:12]+"-")
					ops, elapsed, err := runFor(throughputSlice, c, op)
					if err != nil {
						b.Fatalf("%s at concurrency %d: %v", m.name, c, err)
					}
					if round == 0 {
						continue // warm-up: connections, the server's JIT
					}
					name := fmt.Sprintf("%s/c=%d", m.name, c)
					if totals[name] == nil {
						totals[name] = &total{}
					}
					totals[name].ops += ops
					totals[name].elapsed += elapsed
				}
			}
		}
	}
	rate := func(name string) float64 { return float64(totals[name].ops) / totals[name].elapsed.Seconds() }
	fmt.Fprintf(os.Stdout, "\n%-16s %6s %10s %9s\n", "operation", "conc.", "ops/s", "vs. put")
	for _, c := range concurrencies {
		base := rate(fmt.Sprintf("put/c=%d", c))
		for _, m := range modes {
			r := rate(fmt.Sprintf("%s/c=%d", m.name, c))
			fmt.Fprintf(os.Stdout, "%-16s %6d %10.0f %8.1f%%\n", m.name, c, r, 100*r/base)
			if m.name != "put" {
				b.ReportMetric(100*r/base, fmt.Sprintf("%%put-%s-c%d", m.name, c))
			}
		}
	}
	fmt.Fprintln(os.Stdout)
}

const (
	throughputRounds = 15
	throughputSlice  = 150 * time.Millisecond
)

// runFor runs op on c goroutines, each op with a fresh index, until d has
// passed, and returns how many ops completed and how long that took.
func runFor(d time.Duration, c int, op func(ctx context.Context, i int64) error) (int64, time.Duration, error) {
	ctx := context.Background()
	var (
		next     atomic.Int64
		done     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	start := time.Now()
	stop := start.Add(d)
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				if err := op(ctx, next.Add(1)); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	return done.Load(), time.Since(start), firstErr
}

func benchPut(b *testing.B, prefix string) func(ctx context.Context, i int64) error {
	expr, err := expression.NewBuilder().WithCondition(expression.AttributeNotExists(expression.Name("pk"))).Build()
	if err != nil {
		b.Fatal(err)
	}
	deadline := strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10)
	ttl := strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)
	return func(ctx context.Context, i int64) error {
		_, err := client.PutItem(ctx, &dynamodb.PutItemInput{
			TableName: aws.String(testTable),
			Item: map[string]types.AttributeValue{
				"pk":       &types.AttributeValueMemberS{Value: prefix + strconv.FormatInt(i, 10)},
				"state":    &types.AttributeValueMemberS{Value: "in_progress"},
				"token":    &types.AttributeValueMemberS{Value: storekit.NewToken()},
				"deadline": &types.AttributeValueMemberN{Value: deadline},
				"ttl":      &types.AttributeValueMemberN{Value: ttl},
			},
			ConditionExpression:      expr.Condition(),
			ExpressionAttributeNames: expr.Names(),
		})
		return err
	}
}

func benchPutClaimCondition(b *testing.B, prefix string) func(ctx context.Context, i int64) error {
	cutoff := time.Now().Add(-time.Second).UnixMilli()
	expr, err := expression.NewBuilder().WithCondition(
		expression.AttributeNotExists(expression.Name("pk")).
			Or(expression.Name("deadline").LessThan(expression.Value(cutoff))),
	).Build()
	if err != nil {
		b.Fatal(err)
	}
	deadline := strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10)
	ttl := strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)
	return func(ctx context.Context, i int64) error {
		_, err := client.PutItem(ctx, &dynamodb.PutItemInput{
			TableName: aws.String(testTable),
			Item: map[string]types.AttributeValue{
				"pk":       &types.AttributeValueMemberS{Value: prefix + strconv.FormatInt(i, 10)},
				"state":    &types.AttributeValueMemberS{Value: "in_progress"},
				"token":    &types.AttributeValueMemberS{Value: storekit.NewToken()},
				"deadline": &types.AttributeValueMemberN{Value: deadline},
				"ttl":      &types.AttributeValueMemberN{Value: ttl},
			},
			ConditionExpression:                 expr.Condition(),
			ExpressionAttributeNames:            expr.Names(),
			ExpressionAttributeValues:           expr.Values(),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		return err
	}
}

func benchClaim(b *testing.B, prefix string) func(ctx context.Context, i int64) error {
	s := newStore(b, dynamo.Config{})
	return func(ctx context.Context, i int64) error {
		res, err := s.Claim(ctx, prefix+strconv.FormatInt(i, 10), "", time.Minute)
		if err == nil && res.Outcome != dedup.Acquired {
			err = fmt.Errorf("claim of a fresh key: %v", res.Outcome)
		}
		return err
	}
}

// benchPutUpdate is the floor of the happy path's two round trips: the raw
// PutItem of the baseline, then a raw UpdateItem of the shape of Complete
// (SET state, deadline, ttl; REMOVE result; token/state/deadline
// condition), both built once.
func benchPutUpdate(b *testing.B, prefix string) func(ctx context.Context, i int64) error {
	put := benchPut(b, prefix)
	n, v := expression.Name, expression.Value
	now := time.Now()
	expr, err := expression.NewBuilder().
		WithUpdate(expression.Set(n("state"), v("completed")).
			Set(n("deadline"), v(now.Add(time.Hour).UnixMilli())).
			Set(n("ttl"), v(now.Add(time.Hour).Unix())).
			Remove(n("result"))).
		WithCondition(n("state").Equal(v("in_progress")).And(n("deadline").GreaterThan(v(now.UnixMilli())))).
		Build()
	if err != nil {
		b.Fatal(err)
	}
	return func(ctx context.Context, i int64) error {
		if err := put(ctx, i); err != nil {
			return err
		}
		_, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 aws.String(testTable),
			Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: prefix + strconv.FormatInt(i, 10)}},
			UpdateExpression:          expr.Update(),
			ConditionExpression:       expr.Condition(),
			ExpressionAttributeNames:  expr.Names(),
			ExpressionAttributeValues: expr.Values(),
		})
		return err
	}
}

func benchMiddleware(b *testing.B, prefix string) func(ctx context.Context, i int64) error {
	d, err := dedup.New(dedup.Config{
		Store: newStore(b, dynamo.Config{}),
		Key:   func(msg *message.Message) (string, error) { return msg.Metadata.Get("k"), nil },
		Scope: "bench",
	})
	if err != nil {
		b.Fatal(err)
	}
	var effects atomic.Int64
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		effects.Add(1)
		return nil, nil
	})
	return func(ctx context.Context, i int64) error {
		msg := message.NewMessage(strconv.FormatInt(i, 10), []byte(`{}`))
		msg.SetContext(ctx)
		msg.Metadata.Set("k", prefix+strconv.FormatInt(i, 10))
		before := effects.Load()
		if _, err := h(msg); err != nil {
			return err
		}
		if effects.Load() == before {
			return fmt.Errorf("message %d: the handler did not run", i)
		}
		return nil
	}
}
