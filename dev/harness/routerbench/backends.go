package routerbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
	"github.com/watermill-dedup/watermill-dedup/stores/redis/redisbatch"
)

// Store names accepted in Options.Stores, in the order they are printed.
const (
	StoreMemory = "memory"
	StoreRedis  = "redis"
	// StoreRedisPipelined is the Redis store with Config.AutoPipeline,
	// against the same unpipelined SET NX PX.
	StoreRedisPipelined = "redis-ap"
	StoreDynamo         = "dynamo"
	StorePostgres       = "postgres"
)

// AllStores lists every store the harness knows, in print order.
var AllStores = []string{StoreMemory, StoreRedis, StoreRedisPipelined, StoreDynamo, StorePostgres}

// rawLease is the lease of the raw baselines' records: SET … PX 30000, an
// expiry 30 s ahead, like the middleware's default lease.
const rawLease = 30 * time.Second

// rawRetention is how long the raw baselines' completed records are kept:
// a day, like the middleware's default retention (Config.Retention).
const rawRetention = 24 * time.Hour

// rawToken stands for the owner token a claim writes (32 hex digits, the
// length of the stores' tokens), so the raw write moves as many bytes.
var rawToken = strings.Repeat("0", 32)

// backend is one store under test: the dedup.Store, the raw operation it is
// compared with, and how to release what was started for it.
type backend struct {
	name     string
	describe string // where it runs, printed with the table
	store    dedup.Store
	// raw writes key if absent, with an expiry: the least a claim can cost
	// on this store (one round trip, no token check, no Lua).
	raw func(ctx context.Context, key string) error
	// floor, when set, is the least Claim+Complete can cost on this store
	// (the raw pair): the raw write followed by a raw update of the same
	// item, two round trips as a claim and its completion are (Redis: SET NX
	// PX then SET XX PX; DynamoDB: PutItem then a conditional UpdateItem
	// with prebuilt expressions; PostgreSQL: INSERT … ON CONFLICT DO NOTHING
	// then UPDATE by primary key, two autocommit statements).
	floor func(ctx context.Context, key string) error
	// casFloor, when set, is the raw pair whose update is the
	// compare-and-set DESIGN.md asks of Complete: Redis 7.0 has no SET
	// conditioned on a value, so an EVALSHA of a script that GETs, compares
	// and SETs with PX; DynamoDB an UpdateItem conditioned on the token, the
	// state and the deadline (owner, in progress, lease not ended) that sets
	// the state, the deadline, the TTL and the completion time. The least a
	// Complete that checks its ownership costs on that store.
	casFloor func(ctx context.Context, key string) error
	// floorInRouter adds the router+raw pair lane: a router whose handler
	// (no middleware) runs floor, the floor of router+dedup; and, with
	// casFloor set, the router+raw CAS pair lane, whose handler runs
	// casFloor.
	floorInRouter bool
	// reset, when set, empties the store and the raw baseline's data
	// between measurements (the memory store: its records live in this
	// process's heap).
	reset func()
	// redis is the go-redis client, for the Redis store only.
	redis *goredis.Client

	closers []func()
}

// serverCPU is the CPU time (user and system) the Redis server has used
// since it started, from INFO cpu, with the CPU of its own network I/O; ok
// is false for the other stores and when the server does not answer.
func (b *backend) serverCPU(ctx context.Context) (d time.Duration, ok bool) {
	if b.redis == nil {
		return 0, false
	}
	info, err := b.redis.InfoMap(ctx, "cpu").Result()
	if err != nil {
		return 0, false
	}
	var sum float64
	for _, field := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(info["CPU"][field], 64)
		if err != nil {
			return 0, false
		}
		sum += v
	}
	return time.Duration(sum * float64(time.Second)), true
}

func (b *backend) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
}

// runID is a random hex string that makes this run's keys, prefixes,
// tables and schemas unique, so a shared server's other data is never
// touched.
func runID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func openBackend(ctx context.Context, name, id string) (*backend, error) {
	switch name {
	case StoreMemory:
		return openMemory(), nil
	case StoreRedis:
		return openRedis(ctx, id, false)
	case StoreRedisPipelined:
		return openRedis(ctx, id, true)
	case StoreDynamo:
		return openDynamo(ctx, id)
	case StorePostgres:
		return openPostgres(ctx, id)
	default:
		return nil, fmt.Errorf("routerbench: unknown store %q (one of %s)", name, strings.Join(AllStores, ", "))
	}
}

// openMemory: stores/memory against a mutex-guarded map insert.
func openMemory() *backend {
	type entry struct {
		token    string
		deadline int64
	}
	var (
		mu sync.Mutex
		m  = map[string]entry{}
	)
	store := &swapStore{}
	store.p.Store(memstore.New(nil))
	return &backend{
		name:     StoreMemory,
		describe: "stores/memory in process, emptied before each measurement (as the raw map); raw: insert-if-absent into a map under a sync.Mutex",
		store:    store,
		raw: func(_ context.Context, key string) error {
			deadline := time.Now().Add(rawLease).UnixNano()
			mu.Lock()
			if _, ok := m[key]; !ok {
				m[key] = entry{rawToken, deadline}
			}
			mu.Unlock()
			return nil
		},
		reset: func() {
			store.p.Store(memstore.New(nil))
			mu.Lock()
			m = map[string]entry{}
			mu.Unlock()
		},
	}
}

// swapStore is a memory.Store that reset replaces by an empty one: the
// records of one measurement (millions per second) would otherwise stay in
// this process's heap, and every later measurement, of every store, would
// pay the garbage collector's marking of them.
type swapStore struct{ p atomic.Pointer[memory.Store] }

func (s *swapStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	return s.p.Load().Claim(ctx, key, fp, lease)
}

func (s *swapStore) Complete(ctx context.Context, c dedup.Claim, result []byte, retention time.Duration) error {
	return s.p.Load().Complete(ctx, c, result, retention)
}

func (s *swapStore) Release(ctx context.Context, c dedup.Claim) error {
	return s.p.Load().Release(ctx, c)
}

func (s *swapStore) Extend(ctx context.Context, c dedup.Claim, lease time.Duration) error {
	return s.p.Load().Extend(ctx, c, lease)
}

// redisPoolSize keeps go-redis from queueing at c=64 (its default is ten
// connections per CPU): the raw baseline and the store share the client.
const redisPoolSize = 128

// RedisAddrEnv is the environment variable that, when set, names a running
// redis-server (host:port) the Redis stores use instead of starting one:
// for runs under valgrind (scripts/paired.sh). Keys are unique to the run,
// as always, and nothing is flushed.
const RedisAddrEnv = "DEDUP_BENCH_REDIS_ADDR"

func openRedis(ctx context.Context, id string, autoPipeline bool) (*backend, error) {
	name := StoreRedis
	if autoPipeline {
		name = StoreRedisPipelined
	}
	b := &backend{name: name}
	// RedisAddrEnv names a running server instead of a child of this
	// process: valgrind --tool=callgrind aborts on a child's SIGCHLD.
	addr := os.Getenv(RedisAddrEnv)
	if addr == "" {
		srv, err := testserver.StartRedis()
		if err != nil {
			return nil, err
		}
		b.closers = append(b.closers, func() { _ = srv.Close() })
		addr = srv.Addr
	}
	client := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: redisPoolSize})
	b.closers = append(b.closers, func() { _ = client.Close() })
	b.redis = client
	store, err := dedupredis.New(ctx, dedupredis.Config{Client: client, KeyPrefix: "dedup-bench-" + id + ":", AutoPipeline: autoPipeline})
	if err != nil {
		b.close()
		return nil, err
	}
	b.store = store
	version := "?"
	if info, err := client.InfoMap(ctx, "server").Result(); err == nil {
		version = info["Server"]["redis_version"]
	}
	pairHow := "unpipelined (go-redis Process)"
	if autoPipeline {
		pairHow = "through a pipeline shared by concurrent callers, through the store's own AutoPipeline batcher"
	}
	b.describe = fmt.Sprintf("redis-server %s on %s, go-redis PoolSize %d, store AutoPipeline %v; raw: SET key value NX PX 30000, unpipelined;\n"+
		"  raw pair: SET key value NX PX 30000 then SET key value2 XX PX 86400000, %s;\n"+
		"  raw CAS pair: the same SET NX PX then EVALSHA of %q (value, value2, 86400000), the same way",
		version, addr, redisPoolSize, autoPipeline, pairHow, casSrc)
	rawPrefix := "dedup-bench-raw-" + id + ":"
	b.raw = func(ctx context.Context, key string) error {
		return client.Do(ctx, "set", rawPrefix+key, rawToken, "nx", "px", rawLease.Milliseconds()).Err()
	}
	process := client.Process
	if autoPipeline {
		process = pipelined(redisbatch.New(client, redisbatch.DefaultMaxBatch, redisbatch.DefaultMaxInFlight))
	}
	floorPrefix := "dedup-bench-pair-" + id + ":"
	retention := rawRetention.Milliseconds()
	b.floor = func(ctx context.Context, key string) error {
		key = floorPrefix + key
		if err := process(ctx, goredis.NewCmd(ctx, "set", key, rawToken, "nx", "px", rawLease.Milliseconds())); err != nil {
			return err // goredis.Nil too: NX must set a fresh key
		}
		// XX answers nil when the key is missing: the pair did not hold.
		return process(ctx, goredis.NewCmd(ctx, "set", key, rawDone, "xx", "px", retention))
	}
	sha, err := client.ScriptLoad(ctx, casSrc).Result() // our own server: it keeps it for the run
	if err != nil {
		b.close()
		return nil, err
	}
	casPrefix := "dedup-bench-cas-" + id + ":"
	b.casFloor = func(ctx context.Context, key string) error {
		key = casPrefix + key
		if err := process(ctx, goredis.NewCmd(ctx, "set", key, rawToken, "nx", "px", rawLease.Milliseconds())); err != nil {
			return err
		}
		cmd := goredis.NewCmd(ctx, "evalsha", sha, 1, key, rawToken, rawDone, retention)
		if err := process(ctx, cmd); err != nil {
			return err
		}
		if n, err := cmd.Int64(); err != nil || n != 0 {
			return fmt.Errorf("routerbench: raw CAS pair: reply %d, %v: the value was not the one SET NX wrote", n, err)
		}
		return nil
	}
	b.floorInRouter = true
	return b, nil
}

// casSrc is the least compare-and-set script: the raw CAS pair's second
// write.
const casSrc = "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 1 end redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 0"

// rawDone stands for a completed record's value in the raw pair's second
// write.
var rawDone = strings.Repeat("1", 32)

func openDynamo(ctx context.Context, id string) (*backend, error) {
	node, err := testserver.StartDynalite()
	if err != nil {
		return nil, err
	}
	b := &backend{name: StoreDynamo, closers: []func(){func() { _ = node.Close() }}}
	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("bench", "bench", ""),
		BaseEndpoint: aws.String(node.Endpoint),
		HTTPClient: awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
			t.Proxy = nil
			t.MaxIdleConns = 256
			t.MaxIdleConnsPerHost = 256
		}),
	})
	table := "dedup_bench_" + id
	// dynalite has no UpdateTimeToLive.
	if err := dynamo.CreateTable(ctx, client, dynamo.TableConfig{Table: table, SkipTTL: true}); err != nil {
		b.close()
		return nil, err
	}
	store, err := dynamo.New(ctx, dynamo.Config{Client: client, Table: table, SkipTTL: true})
	if err != nil {
		b.close()
		return nil, err
	}
	b.store = store
	b.describe = fmt.Sprintf("dynalite (tools/node_modules) at %s, table %s; raw: PutItem with attribute_not_exists(pk);\n"+
		"  raw pair: the same PutItem then UpdateItem of its deadline conditioned on its token (prebuilt expressions);\n"+
		"  raw CAS pair: the same PutItem (with a state) then UpdateItem of state, deadline, ttl and completed_at conditioned on token, state and deadline", node.Endpoint, table)
	expr, err := expression.NewBuilder().
		WithCondition(expression.AttributeNotExists(expression.Name(dynamo.DefaultPartitionKey))).Build()
	if err != nil {
		b.close()
		return nil, err
	}
	rawPrefix := "raw#" + id + "#"
	put := func(ctx context.Context, key string) error {
		deadline := time.Now().Add(rawLease).UnixMilli()
		_, err := client.PutItem(ctx, &dynamodb.PutItemInput{
			TableName: aws.String(table),
			Item: map[string]types.AttributeValue{
				dynamo.DefaultPartitionKey:      &types.AttributeValueMemberS{Value: rawPrefix + key},
				dynamo.DefaultTokenAttribute:    &types.AttributeValueMemberS{Value: rawToken},
				dynamo.DefaultDeadlineAttribute: &types.AttributeValueMemberN{Value: strconv.FormatInt(deadline, 10)},
			},
			ConditionExpression:       expr.Condition(),
			ExpressionAttributeNames:  expr.Names(),
			ExpressionAttributeValues: expr.Values(),
		})
		var failed *types.ConditionalCheckFailedException
		if errors.As(err, &failed) { // the key exists: what NX answers with nil
			return nil
		}
		return err
	}
	b.raw = put
	// The floor's update: what Complete's UpdateItem does, with the token
	// condition, prebuilt.
	upd, err := expression.NewBuilder().
		WithCondition(expression.Name(dynamo.DefaultTokenAttribute).Equal(expression.Value(rawToken))).
		WithUpdate(expression.Set(expression.Name(dynamo.DefaultDeadlineAttribute), expression.Value(time.Now().Add(rawRetention).UnixMilli()))).
		Build()
	if err != nil {
		b.close()
		return nil, err
	}
	floorPrefix := "floor#" + id + "#"
	b.floor = func(ctx context.Context, key string) error {
		if err := put(ctx, floorPrefix+key); err != nil { // pk = rawPrefix + floorPrefix + key
			return err
		}
		_, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 aws.String(table),
			Key:                       map[string]types.AttributeValue{dynamo.DefaultPartitionKey: &types.AttributeValueMemberS{Value: rawPrefix + floorPrefix + key}},
			UpdateExpression:          upd.Update(),
			ConditionExpression:       upd.Condition(),
			ExpressionAttributeNames:  upd.Names(),
			ExpressionAttributeValues: upd.Values(),
		})
		return err
	}
	if b.casFloor, err = dynamoCASFloor(client, table, "cas#"+id+"#", expr); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// dynamoCASFloor is DynamoDB's raw CAS pair (see backend.casFloor): a
// PutItem under create, then the UpdateItem a Complete makes, with
// expressions built once.
func dynamoCASFloor(client *dynamodb.Client, table, prefix string, create expression.Expression) (func(context.Context, string) error, error) {
	const (
		inProgress = "in_progress"
		completed  = "completed"
	)
	name := expression.Name
	owned := name(dynamo.DefaultTokenAttribute).Equal(expression.Value(rawToken)).And(
		name(dynamo.DefaultStateAttribute).Equal(expression.Value(inProgress)),
		name(dynamo.DefaultDeadlineAttribute).GreaterThan(expression.Value(time.Now().UnixMilli())))
	done := time.Now().Add(rawRetention)
	set := expression.Set(name(dynamo.DefaultStateAttribute), expression.Value(completed)).
		Set(name(dynamo.DefaultDeadlineAttribute), expression.Value(done.UnixMilli())).
		Set(name(dynamo.DefaultTTLAttribute), expression.Value(done.Unix())).
		Set(name(dynamo.DefaultCompletedAtAttribute), expression.Value(time.Now().UTC().Format(time.RFC3339Nano)))
	upd, err := expression.NewBuilder().WithCondition(owned).WithUpdate(set).Build()
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, key string) error {
		pk := &types.AttributeValueMemberS{Value: prefix + key}
		_, err := client.PutItem(ctx, &dynamodb.PutItemInput{
			TableName: aws.String(table),
			Item: map[string]types.AttributeValue{
				dynamo.DefaultPartitionKey:      pk,
				dynamo.DefaultStateAttribute:    &types.AttributeValueMemberS{Value: inProgress},
				dynamo.DefaultTokenAttribute:    &types.AttributeValueMemberS{Value: rawToken},
				dynamo.DefaultDeadlineAttribute: &types.AttributeValueMemberN{Value: strconv.FormatInt(time.Now().Add(rawLease).UnixMilli(), 10)},
			},
			ConditionExpression:       create.Condition(),
			ExpressionAttributeNames:  create.Names(),
			ExpressionAttributeValues: create.Values(),
		})
		if err != nil {
			return err // a fresh key: a failed condition is an error here
		}
		_, err = client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 aws.String(table),
			Key:                       map[string]types.AttributeValue{dynamo.DefaultPartitionKey: pk},
			UpdateExpression:          upd.Update(),
			ConditionExpression:       upd.Condition(),
			ExpressionAttributeNames:  upd.Names(),
			ExpressionAttributeValues: upd.Values(),
		})
		return err
	}, nil
}

// pgMaxConns is the pool size for PostgreSQL: enough for c=16 without
// queueing, and well below max_connections of a server others may share.
const pgMaxConns = 16

func openPostgres(ctx context.Context, id string) (*backend, error) {
	srv, err := testserver.StartPostgres()
	if err != nil {
		return nil, err
	}
	b := &backend{name: StorePostgres, closers: []func(){func() { _ = srv.Close() }}}
	cfg, err := pgxpool.ParseConfig(srv.DSN)
	if err != nil {
		b.close()
		return nil, err
	}
	cfg.MaxConns = pgMaxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		b.close()
		return nil, fmt.Errorf("routerbench: connecting to %s: %w", srv.DSN, err)
	}
	b.closers = append(b.closers, pool.Close)
	// A schema of our own, dropped at the end: a shared server's other
	// schemas are never touched.
	schema := "dedup_bench_" + id
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		b.close()
		return nil, fmt.Errorf("routerbench: create schema: %w", err)
	}
	b.closers = append(b.closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	store, err := postgres.New(ctx, postgres.Config{DB: pool, Schema: schema})
	if err == nil {
		err = store.Migrate(ctx)
	}
	if err != nil {
		b.close()
		return nil, err
	}
	b.store = store
	// The raw table holds what a hand-written guard keeps: the key as
	// primary key, a token and an expiry, with the expiry indexed for
	// cleanup, as the store's table does.
	raw := pgx.Identifier{schema, "raw_keys"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+raw+" (key text PRIMARY KEY, token text NOT NULL, expires_at timestamptz NOT NULL); "+
		"CREATE INDEX ON "+raw+" (expires_at)"); err != nil {
		b.close()
		return nil, fmt.Errorf("routerbench: create raw table: %w", err)
	}
	version := "?"
	_ = pool.QueryRow(ctx, "SHOW server_version").Scan(&version)
	shared := ""
	if srv.Shared {
		shared = ", shared server (own schema)"
	}
	b.describe = fmt.Sprintf("PostgreSQL %s at %s%s, pgxpool MaxConns %d; raw: INSERT … ON CONFLICT DO NOTHING into (key text PRIMARY KEY, token, expires_at indexed)",
		version, cfg.ConnConfig.Host+":"+strconv.Itoa(int(cfg.ConnConfig.Port)), shared, pgMaxConns)
	insert := func(table string) string {
		return "INSERT INTO " + table + " (key, token, expires_at) VALUES ($1, $2, clock_timestamp() + $3 * interval '1 millisecond') ON CONFLICT DO NOTHING"
	}
	rawInsert := insert(raw)
	b.raw = func(ctx context.Context, key string) error {
		_, err := pool.Exec(ctx, rawInsert, key, rawToken, rawLease.Milliseconds())
		return err
	}
	// The raw pair writes a table of its own, like the raw one, so that
	// neither grows the other's index.
	pairTable := pgx.Identifier{schema, "pair_keys"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+pairTable+" (key text PRIMARY KEY, token text NOT NULL, expires_at timestamptz NOT NULL); "+
		"CREATE INDEX ON "+pairTable+" (expires_at)"); err != nil {
		b.close()
		return nil, fmt.Errorf("routerbench: create raw pair table: %w", err)
	}
	pairInsert := insert(pairTable)
	pairUpdate := "UPDATE " + pairTable + " SET token = $2, expires_at = clock_timestamp() + $3 * interval '1 millisecond' WHERE key = $1 AND token = $4"
	retention := rawRetention.Milliseconds()
	b.floor = func(ctx context.Context, key string) error {
		if _, err := pool.Exec(ctx, pairInsert, key, rawToken, rawLease.Milliseconds()); err != nil {
			return err
		}
		tag, err := pool.Exec(ctx, pairUpdate, key, rawDone, retention, rawToken)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("routerbench: raw pair update of %q: %d rows", key, tag.RowsAffected())
		}
		return err
	}
	b.describe += ";\n  raw pair: the same INSERT into a table of its own, then UPDATE of token and expires_at by primary key and token, two autocommit statements"
	return b, nil
}

// pendings are the places where the floor's pipelined commands wait (the
// store keeps one in its pooled arguments).
var pendings = sync.Pool{New: func() any { return new(redisbatch.Pending) }}

// pipelined sends each command through b, the store's own batcher, so that
// the redis-ap floor batches exactly as the store does, without the
// store's work.
func pipelined(b *redisbatch.Batcher) func(context.Context, goredis.Cmder) error {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		p := pendings.Get().(*redisbatch.Pending)
		err := b.Process(ctx, cmd, p)
		*p = redisbatch.Pending{}
		pendings.Put(p)
		return err
	}
}
