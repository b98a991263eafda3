// Package batchcrash proves by crashing, on real stores, that a batch
// (a Lambda SQS invocation through lambdadedup, which claims its records
// with dedup.Engine.DoBatch) completes each record as soon as its handler
// returns: a consumer process is killed with SIGKILL while a later
// record's handler hangs, and the records are delivered again.
package batchcrash

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/crashtest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/pgtest"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

const (
	scope = "charge-orders"
	// invocation is the killed consumer's invocation time: the leases of
	// its claims end then, when the redelivery can take them over.
	invocation = 2 * time.Second
	// margin is the killed consumer's DeadlineMargin: B starts well
	// before it.
	margin = 500 * time.Millisecond
	// completedBound bounds the wait for A's record to read completed
	// while B's handler hangs (real time: what the fixed adapter does at
	// once, and the adapter of the bug never does).
	completedBound = 10 * time.Second
)

// recordStore is what a test needs of a store: the engine's, and the
// operator's view of a record.
type recordStore interface {
	dedup.Store
	admin.Interface
}

// backend is a real store and, next to it, the charges of each order: an
// effect outside the record's transaction (a payment API would be one).
type backend struct {
	store recordStore
	// charge adds one charge of order.
	charge func(ctx context.Context, order string) error
	// charges reads how many times order was charged.
	charges func(ctx context.Context, order string) (int, error)
	// env is what a child needs to open the same backend.
	env []string
}

// openRedis opens the backend in Redis at addr under the key prefix ns
// (ending with ":").
func openRedis(t *testing.T, addr, ns string) backend {
	t.Helper()
	client := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { _ = client.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, err := redis.New(ctx, redis.Config{Client: client, KeyPrefix: ns})
	if err != nil {
		t.Fatal(err)
	}
	key := func(order string) string { return ns + "charged:" + order }
	return backend{
		store:  store,
		charge: func(ctx context.Context, order string) error { return client.Incr(ctx, key(order)).Err() },
		charges: func(ctx context.Context, order string) (int, error) {
			n, err := client.Get(ctx, key(order)).Int()
			if errors.Is(err, goredis.Nil) {
				return 0, nil
			}
			return n, err
		},
		env: []string{envRedis + "=" + addr, envNamespace + "=" + ns},
	}
}

// openPostgres opens the backend in PostgreSQL at dsn in the schema ns;
// create makes the schema (named ns and random hex) and its tables (the
// parent's job).
func openPostgres(t *testing.T, dsn, ns string, create bool) backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if create {
		ns = pgtest.Schema(t, pool.Exec, ns)
	}
	store, err := postgres.New(ctx, postgres.Config{DB: pool, Schema: ns})
	if err != nil {
		t.Fatal(err)
	}
	table := pgx.Identifier{ns, "charges"}.Sanitize()
	if create {
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "CREATE TABLE "+table+" (order_id text PRIMARY KEY, n int NOT NULL)"); err != nil {
			t.Fatal(err)
		}
	}
	return backend{
		store: store,
		charge: func(ctx context.Context, order string) error {
			_, err := pool.Exec(ctx, "INSERT INTO "+table+" AS c VALUES ($1, 1) ON CONFLICT (order_id) DO UPDATE SET n = c.n + 1", order)
			return err
		},
		charges: func(ctx context.Context, order string) (int, error) {
			var n int
			err := pool.QueryRow(ctx, "SELECT n FROM "+table+" WHERE order_id = $1", order).Scan(&n)
			if errors.Is(err, pgx.ErrNoRows) {
				return 0, nil
			}
			return n, err
		},
		env: []string{envDSN + "=" + dsn, envNamespace + "=" + ns},
	}
}

// sqsBatch is the SQS event of orders A and B, in that order.
func sqsBatch(t *testing.T) []byte {
	t.Helper()
	var records []events.SQSMessage
	for i, order := range []string{"A", "B"} {
		records = append(records, events.SQSMessage{MessageId: fmt.Sprint("m", i+1), Body: fmt.Sprintf(`{"order_id":%q}`, order),
			EventSource: "aws:sqs", EventSourceARN: "arn:aws:sqs:us-east-1:000000000000:orders", AWSRegion: "us-east-1"})
	}
	payload, err := json.Marshal(events.SQSEvent{Records: records})
	if err != nil {
		t.Fatal(err)
	}
	return payload
}

// runChild is the consumer that is killed: one invocation of the Lambda
// SQS adapter with orders A and B; A's handler charges A, B's reports
// "b-running" and hangs (a payment provider that does not answer) until
// the parent kills the process.
func runChild(t *testing.T, b backend) {
	h, err := lambdadedup.New(lambdadedup.Config{DeadlineMargin: margin,
		Dedup: dedup.Config{Store: b.store, Scope: scope, Key: keyfuncs.JSON("order_id")}},
		func(msg *message.Message) error {
			order, err := keyfuncs.JSON("order_id")(msg)
			if err != nil {
				return err
			}
			if order == "B" {
				crashtest.Reach("b-running")
			}
			return b.charge(msg.Context(), order)
		})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), invocation)
	defer cancel()
	out, err := lambda.NewHandler(h.Handle).Invoke(ctx, sqsBatch(t))
	t.Fatalf("the invocation returned (%s, %v) instead of hanging in B's handler", out, err)
}

// TestKilledBatchChargedOnce proves, on a real Redis and a real
// PostgreSQL, that a record of a batch whose handler returned is
// completed in the store before the batch's last handler returns, so that
// a consumer killed then does not charge it again on redelivery. A child
// process runs an SQS invocation of orders A and B through lambdadedup: A
// is charged (a counter next to the records), B's handler hangs. Once A's
// record reads completed, the child is killed with SIGKILL; the
// redelivered batch, in this process, waits out B's lease (which ends at
// the dead invocation's deadline) and runs B. A is charged exactly once,
// B once. (The batch completed its records only after its last handler:
// A's record stayed in progress until the kill, its lease ended with the
// invocation, and the redelivery charged A a second time.)
func TestKilledBatchChargedOnce(t *testing.T) {
	for _, name := range []string{"redis", "postgres"} {
		t.Run(name, func(t *testing.T) {
			open := func(create bool) backend {
				ns := os.Getenv(envNamespace)
				run := "batchcrash_" + strconv.FormatUint(rand.Uint64(), 36)
				if name == "redis" {
					if create {
						ns = run + ":"
					}
					return openRedis(t, map[bool]string{true: redisAddr, false: os.Getenv(envRedis)}[create], ns)
				}
				if create {
					ns = run + "_"
				}
				return openPostgres(t, map[bool]string{true: pgDSN, false: os.Getenv(envDSN)}[create], ns, create)
			}
			if crashtest.IsChild(t) {
				runChild(t, open(false))
				return
			}
			ctx := context.Background()
			b := open(true)
			child := crashtest.Start(t, b.env)
			child.Wait(t, "b-running")

			keyA := admin.ScopedKey(scope, "A")
			state := func() string {
				r, err := b.store.Inspect(ctx, keyA)
				switch {
				case errors.Is(err, admin.ErrNotFound):
					return "absent (an in-progress record whose lease ended, or none)"
				case err != nil:
					return err.Error()
				}
				return r.State
			}
			var seen []string // the states A's record went through
			for deadline := time.Now().Add(completedBound); ; {
				if s := state(); len(seen) == 0 || seen[len(seen)-1] != s {
					seen = append(seen, s)
				}
				if seen[len(seen)-1] == admin.StateCompleted || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond) // polling the real store, whose clock no fake clock moves
			}
			if s := seen[len(seen)-1]; s != admin.StateCompleted {
				t.Errorf("A's record read %q within %v after B's handler started (A's handler returned before it); want completed (A's completion waits for the batch's last handler)",
					seen, completedBound)
			}
			child.Kill(t)

			// The redelivery: A is a duplicate, B waits until the dead
			// invocation's lease on it ends, then runs.
			h, err := lambdadedup.New(lambdadedup.Config{DeadlineMargin: margin,
				Dedup: dedup.Config{Store: b.store, Scope: scope, Key: keyfuncs.JSON("order_id"), InProgressWait: 20 * time.Second, InProgressPoll: 50 * time.Millisecond}},
				func(msg *message.Message) error {
					order, err := keyfuncs.JSON("order_id")(msg)
					if err != nil {
						return err
					}
					return b.charge(msg.Context(), order)
				})
			if err != nil {
				t.Fatal(err)
			}
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			out, err := lambda.NewHandler(h.Handle).Invoke(rctx, sqsBatch(t))
			var resp events.SQSEventResponse
			if err == nil {
				err = json.Unmarshal(out, &resp)
			}
			if err != nil || len(resp.BatchItemFailures) != 0 {
				t.Errorf("redelivery: %s, %v; want no failure", out, err)
			}
			for order, want := range map[string]int{"A": 1, "B": 1} {
				n, err := b.charges(ctx, order)
				if err != nil {
					t.Fatal(err)
				}
				if n != want {
					t.Errorf("%s charged %d times over the killed invocation and the redelivery, want %d", order, n, want)
				}
			}
		})
	}
}
