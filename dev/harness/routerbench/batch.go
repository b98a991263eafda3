package routerbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// BatchStores are the stores RunBatch measures by default, in print order.
var BatchStores = []string{StoreMemory, StoreRedis, StorePostgres, StoreDynamo}

// BatchOptions configures RunBatch.
type BatchOptions struct {
	// Stores to measure (of BatchStores). Defaults to BatchStores.
	Stores []string
	// Sizes are the batch sizes. Defaults to 1, 10, 100.
	Sizes []int
	// Repetitions of the interleaved round. Defaults to 5.
	Repetitions int
	// Out gets the table; Progress the progress lines (nil: none).
	Out, Progress io.Writer
}

// batchBackend is one store under the batch benchmark: the store, the
// count of requests sent to its server, and the raw floor of a batch.
type batchBackend struct {
	name, describe string
	store          dedup.Store
	// requests counts the requests the store sent (a pipeline or a
	// pgx.Batch is one); nil for the memory store.
	requests *atomic.Int64
	// floor claims and completes keys the least way the server allows,
	// without the store: one pipeline (or batch) of raw writes, then one
	// of raw updates; nil where there is none.
	floor   func(ctx context.Context, keys []string) error
	closers []func()
}

func (b *batchBackend) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
}

// RunBatch measures, per store and batch size, the time per batch of new
// keys (a no-op handler) through the per-record path (Engine.Do for each
// record, one after the other, as lambdadedup did) and through
// Engine.DoBatch, and the store's raw floor, interleaved in each
// repetition, and prints medians, their ratios and the requests per batch.
func RunBatch(ctx context.Context, o BatchOptions) error {
	if len(o.Stores) == 0 {
		o.Stores = BatchStores
	}
	if len(o.Sizes) == 0 {
		o.Sizes = []int{1, 10, 100}
	}
	if o.Repetitions <= 0 {
		o.Repetitions = 5
	}
	progress := func(format string, args ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "dedup-bench: "+format+"\n", args...)
		}
	}
	id := runID()
	loadStart := loadavg()
	tw := tabwriter.NewWriter(o.Out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(o.Out, "batch claims: time per batch of new keys (no-op handler), median over %d interleaved repetitions\n", o.Repetitions)
	fmt.Fprintln(tw, "store\tbatch\tper-record\tDoBatch\tper-record/DoBatch\trequests per-record\trequests DoBatch\traw floor\tDoBatch/floor\trequests one by one\t")
	var descs []string
	for _, name := range o.Stores {
		b, err := openBatchBackend(ctx, name, id)
		if err != nil {
			return err
		}
		descs = append(descs, fmt.Sprintf("%s: %s", b.name, b.describe))
		e, err := dedup.NewEngine(dedup.Config{Store: b.store, Lease: 30 * time.Second, Retention: time.Hour})
		if err != nil {
			b.close()
			return err
		}
		for _, n := range o.Sizes {
			batches := max(5, 200/n) // per lane and repetition
			var perRec, batched, floor []float64
			var perRecReq, batchReq int64
			seq := 0
			keys := func() []string {
				ks := make([]string, n)
				for i := range ks {
					seq++
					ks[i] = fmt.Sprintf("%s-%d-%d", id, n, seq)
				}
				return ks
			}
			for rep := range o.Repetitions {
				progress("%s, batches of %d: repetition %d/%d (load %s)", name, n, rep+1, o.Repetitions, loadavg())
				for range batches {
					// The three lanes interleaved, batch by batch.
					ks := keys()
					before := b.count()
					start := time.Now()
					for _, k := range ks {
						res, err := e.Do(ctx, dedup.Call{Scope: "per-record", Key: k}, noop)
						if err != nil || res.Outcome != dedup.Acquired {
							b.close()
							return fmt.Errorf("routerbench: %s per-record: %v %v", name, res.Outcome, err)
						}
					}
					perRec = append(perRec, float64(time.Since(start)))
					perRecReq += b.count() - before

					// Every call at once, their handlers returning together:
					// each waits until all have started.
					before = b.count()
					start = time.Now()
					if err := doBatch(ctx, e, keys(), n, together(n)); err != nil {
						b.close()
						return fmt.Errorf("routerbench: %s %w", name, err)
					}
					batched = append(batched, float64(time.Since(start)))
					batchReq += b.count() - before

					if b.floor != nil {
						ks = keys()
						start = time.Now()
						if err := b.floor(ctx, ks); err != nil {
							b.close()
							return fmt.Errorf("routerbench: %s raw floor: %w", name, err)
						}
						floor = append(floor, float64(time.Since(start)))
					}
				}
			}
			// Handlers that return one by one: one call at a time, each
			// taking slowHandler; only the requests are reported.
			var slowReq int64
			slowBatches := max(2, 20/n) * o.Repetitions
			if b.requests != nil {
				progress("%s, batches of %d: %d batches of %v handlers one at a time", name, n, slowBatches, slowHandler)
				for range slowBatches {
					before := b.count()
					if err := doBatch(ctx, e, keys(), 1, func() { time.Sleep(slowHandler) }); err != nil {
						b.close()
						return fmt.Errorf("routerbench: %s %w", name, err)
					}
					slowReq += b.count() - before
				}
			}
			total := int64(batches * o.Repetitions)
			mp, mb := median(perRec), median(batched)
			reqs := func(n int64) string {
				if b.requests == nil {
					return "-"
				}
				return strconv.FormatFloat(float64(n)/float64(total), 'f', 1, 64)
			}
			fl, ratio := "-", "-"
			if len(floor) > 0 {
				mf := median(floor)
				fl, ratio = fmtDur(mf), fmt.Sprintf("%.2f", mb/mf)
			}
			slow := "-"
			if b.requests != nil {
				slow = strconv.FormatFloat(float64(slowReq)/float64(slowBatches), 'f', 1, 64)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%.1fx\t%s\t%s\t%s\t%s\t%s\t\n", name, n, fmtDur(mp), fmtDur(mb), mp/mb, reqs(perRecReq), reqs(batchReq), fl, ratio, slow)
		}
		b.close()
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(o.Out, "per-record: Engine.Do for each record, one after the other; DoBatch: Engine.DoBatch of the batch, Concurrency the batch's size (the claims in one request where the store allows, then the completions as the handlers return together);")
	fmt.Fprintf(o.Out, "requests one by one: per DoBatch of Concurrency 1 whose handlers take %v each (a completion leaves as its handler returns; those that end while one is in flight share the next request)\n", slowHandler)
	fmt.Fprintln(o.Out, "requests: to the store's server per batch (a pipeline or a pgx.Batch is one; DynamoDB's are concurrent); raw floor: the least a batch's claim and completion cost without the store")
	for _, d := range descs {
		fmt.Fprintln(o.Out, "  "+d)
	}
	fmt.Fprintf(o.Out, "machine: nproc %d, GOMAXPROCS %d, %s %s/%s; /proc/loadavg at start %s, at end %s\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH, loadStart, loadavg())
	return nil
}

func noop(context.Context) ([]byte, error) { return nil, nil }

// slowHandler is the handler time of the batches whose handlers return one
// by one.
const slowHandler = time.Millisecond

// together returns a handler's work for a batch of n calls run at once:
// each returns once all n have started, so that they return together.
func together(n int) func() {
	var wg sync.WaitGroup
	wg.Add(n)
	return func() {
		wg.Done()
		wg.Wait()
	}
}

// doBatch runs one DoBatch of new keys at concurrency, each call's work
// running work (nil: nothing), and checks that every call ran.
func doBatch(ctx context.Context, e *dedup.Engine, keys []string, concurrency int, work func()) error {
	calls := make([]dedup.BatchCall, len(keys))
	for i, k := range keys {
		calls[i] = dedup.BatchCall{Call: dedup.Call{Scope: "batch", Key: k}}
	}
	res, errs := e.DoBatch(ctx, dedup.Batch{Calls: calls, Concurrency: concurrency}, func(context.Context, int) ([]byte, error) {
		if work != nil {
			work()
		}
		return nil, nil
	})
	for i, r := range res {
		if errs[i] != nil || r.Outcome != dedup.Acquired {
			return fmt.Errorf("DoBatch, call %d: %v %v", i, r.Outcome, errs[i])
		}
	}
	return nil
}

// fmtDur prints a duration in nanoseconds with three significant figures.
func fmtDur(ns float64) string {
	return time.Duration(ns).Round(time.Microsecond).String()
}

func (b *batchBackend) count() int64 {
	if b.requests == nil {
		return 0
	}
	return b.requests.Load()
}

func openBatchBackend(ctx context.Context, name, id string) (*batchBackend, error) {
	switch name {
	case StoreMemory:
		s, err := memory.New(ctx, memory.Config{})
		if err != nil {
			return nil, err
		}
		return &batchBackend{name: name, describe: "stores/memory (one lock per batch operation)", store: s}, nil
	case StoreRedis:
		return openBatchRedis(ctx, id)
	case StorePostgres:
		return openBatchPostgres(ctx, id)
	case StoreDynamo:
		return openBatchDynamo(ctx, id)
	}
	return nil, fmt.Errorf("routerbench: the batch benchmark knows no store %q (one of %v)", name, BatchStores)
}

// requestHook counts go-redis requests: a command, or a pipeline.
type requestHook struct{ n *atomic.Int64 }

func (h requestHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h requestHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h requestHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

func openBatchRedis(ctx context.Context, id string) (*batchBackend, error) {
	srv, err := testserver.StartRedis()
	if err != nil {
		return nil, err
	}
	b := &batchBackend{name: StoreRedis, requests: new(atomic.Int64), closers: []func(){func() { _ = srv.Close() }}}
	client := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: redisPoolSize})
	b.closers = append(b.closers, func() { _ = client.Close() })
	store, err := dedupredis.New(ctx, dedupredis.Config{Client: client, KeyPrefix: "dedup-batch-bench-" + id + ":"})
	if err != nil {
		b.close()
		return nil, err
	}
	client.AddHook(requestHook{b.requests})
	b.store = store
	b.describe = fmt.Sprintf("redis-server at %s; raw floor: one pipeline of SET key value NX PX 30000, then one of SET key value2 XX PX 86400000", srv.Addr)
	retention := (24 * time.Hour).Milliseconds()
	b.floor = func(ctx context.Context, keys []string) error {
		for _, args := range [][]any{{rawToken, "nx", "px", rawLease.Milliseconds()}, {rawDone, "xx", "px", retention}} {
			p := client.Pipeline()
			for _, k := range keys {
				p.Do(ctx, append([]any{"set", "dedup-batch-raw-" + id + ":" + k}, args...)...)
			}
			if _, err := p.Exec(ctx); err != nil {
				return err
			}
		}
		return nil
	}
	return b, nil
}

// countingDB counts the round trips through a pool: a statement, or a
// pgx.Batch.
type countingDB struct {
	*pgxpool.Pool
	n *atomic.Int64
}

func (d countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	d.n.Add(1)
	return d.Pool.Exec(ctx, sql, args...)
}

func (d countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	d.n.Add(1)
	return d.Pool.QueryRow(ctx, sql, args...)
}

func (d countingDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	d.n.Add(1)
	return d.Pool.SendBatch(ctx, b)
}

func openBatchPostgres(ctx context.Context, id string) (*batchBackend, error) {
	srv, err := testserver.StartPostgres()
	if err != nil {
		return nil, err
	}
	b := &batchBackend{name: StorePostgres, requests: new(atomic.Int64), closers: []func(){func() { _ = srv.Close() }}}
	pool, err := pgxpool.New(ctx, srv.DSN)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		b.close()
		return nil, fmt.Errorf("routerbench: connecting to %s: %w", srv.DSN, err)
	}
	b.closers = append(b.closers, pool.Close)
	schema := "dedup_batch_bench_" + id
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		b.close()
		return nil, err
	}
	b.closers = append(b.closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	store, err := postgres.New(ctx, postgres.Config{DB: countingDB{pool, b.requests}, Schema: schema})
	if err == nil {
		err = store.Migrate(ctx)
	}
	if err != nil {
		b.close()
		return nil, err
	}
	b.store = store
	raw := pgx.Identifier{schema, "raw_keys"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+raw+" (key text PRIMARY KEY, token text NOT NULL, expires_at timestamptz NOT NULL)"); err != nil {
		b.close()
		return nil, err
	}
	b.describe = fmt.Sprintf("PostgreSQL at %s; raw floor: one pgx.Batch of INSERT … ON CONFLICT DO NOTHING into (key text PRIMARY KEY, token, expires_at), then one of UPDATE by key", srv.DSN)
	b.floor = func(ctx context.Context, keys []string) error {
		for _, sql := range []string{
			"INSERT INTO " + raw + " (key, token, expires_at) VALUES ($1, $2, now() + interval '30 seconds') ON CONFLICT DO NOTHING",
			"UPDATE " + raw + " SET token = $2, expires_at = now() + interval '1 day' WHERE key = $1",
		} {
			batch := &pgx.Batch{}
			for _, k := range keys {
				batch.Queue(sql, k, rawToken)
			}
			if err := pool.SendBatch(ctx, batch).Close(); err != nil {
				return err
			}
		}
		return nil
	}
	return b, nil
}

// countingDynamo counts the requests through a DynamoDB client.
type countingDynamo struct {
	dynamo.Client
	n *atomic.Int64
}

func (c countingDynamo) PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	c.n.Add(1)
	return c.Client.PutItem(ctx, in, opts...)
}

func (c countingDynamo) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	c.n.Add(1)
	return c.Client.UpdateItem(ctx, in, opts...)
}

func (c countingDynamo) GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	c.n.Add(1)
	return c.Client.GetItem(ctx, in, opts...)
}

func openBatchDynamo(ctx context.Context, id string) (*batchBackend, error) {
	node, err := testserver.StartDynalite()
	if err != nil {
		return nil, err
	}
	b := &batchBackend{name: StoreDynamo, requests: new(atomic.Int64), closers: []func(){func() { _ = node.Close() }}}
	client := dynamodb.New(dynamodb.Options{
		Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("bench", "bench", ""),
		BaseEndpoint: aws.String(node.Endpoint),
		HTTPClient: awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
			t.Proxy, t.MaxIdleConns, t.MaxIdleConnsPerHost = nil, 256, 256
		}),
	})
	table := "dedup_batch_bench_" + id
	if err := dynamo.CreateTable(ctx, client, dynamo.TableConfig{Table: table, SkipTTL: true}); err != nil {
		b.close()
		return nil, err
	}
	store, err := dynamo.New(ctx, dynamo.Config{Client: countingDynamo{client, b.requests}, Table: table, SkipTTL: true}) // dynalite has no Time to Live
	if err != nil {
		b.close()
		return nil, err
	}
	b.store = store
	b.describe = fmt.Sprintf("dynalite at %s; raw floor: %d concurrent PutItem with attribute_not_exists(pk), then %d concurrent UpdateItem conditioned on the token (prebuilt expressions)",
		node.Endpoint, dynamo.BatchConcurrency, dynamo.BatchConcurrency)
	create, err := expression.NewBuilder().WithCondition(expression.AttributeNotExists(expression.Name(dynamo.DefaultPartitionKey))).Build()
	if err != nil {
		b.close()
		return nil, err
	}
	update, err := expression.NewBuilder().
		WithCondition(expression.Name(dynamo.DefaultTokenAttribute).Equal(expression.Value(rawToken))).
		WithUpdate(expression.Set(expression.Name(dynamo.DefaultDeadlineAttribute), expression.Value(time.Now().Add(24*time.Hour).UnixMilli()))).
		Build()
	if err != nil {
		b.close()
		return nil, err
	}
	b.floor = func(ctx context.Context, keys []string) error {
		errs := make([]error, len(keys))
		storekit.Each(len(keys), dynamo.BatchConcurrency, func(i int) {
			pk := &types.AttributeValueMemberS{Value: "raw#" + id + "#" + keys[i]}
			_, errs[i] = client.PutItem(ctx, &dynamodb.PutItemInput{
				TableName: aws.String(table),
				Item: map[string]types.AttributeValue{
					dynamo.DefaultPartitionKey:      pk,
					dynamo.DefaultTokenAttribute:    &types.AttributeValueMemberS{Value: rawToken},
					dynamo.DefaultDeadlineAttribute: &types.AttributeValueMemberN{Value: strconv.FormatInt(time.Now().Add(rawLease).UnixMilli(), 10)},
				},
				ConditionExpression: create.Condition(), ExpressionAttributeNames: create.Names(), ExpressionAttributeValues: create.Values(),
			})
		})
		if err := errors.Join(errs...); err != nil {
			return err
		}
		storekit.Each(len(keys), dynamo.BatchConcurrency, func(i int) {
			_, errs[i] = client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
				TableName:           aws.String(table),
				Key:                 map[string]types.AttributeValue{dynamo.DefaultPartitionKey: &types.AttributeValueMemberS{Value: "raw#" + id + "#" + keys[i]}},
				ConditionExpression: update.Condition(), UpdateExpression: update.Update(),
				ExpressionAttributeNames: update.Names(), ExpressionAttributeValues: update.Values(),
			})
		})
		return errors.Join(errs...)
	}
	return b, nil
}
