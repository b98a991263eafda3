package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/cmd/dedupctl/env/awsenv"
	"github.com/watermill-dedup/watermill-dedup/cmd/dedupctl/env/redisaddr"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// usageError is a configuration mistake the user can fix with flags
// (exit status 2), as opposed to a store that cannot be reached (1).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// openStore connects to the store named by opts.store and returns its Admin,
// a description of where it is, and a function that closes the connection.
func openStore(ctx context.Context, opts options) (admin.Interface, string, func(), error) {
	switch opts.store {
	case "redis":
		return openRedis(ctx, opts)
	case "dynamo":
		return openDynamo(ctx, opts)
	case "postgres":
		return openPostgres(ctx, opts)
	default:
		return nil, "", nil, &usageError{fmt.Sprintf("unknown -store %q (redis, dynamo or postgres)", opts.store)}
	}
}

// redisClient builds a client from a -redis-addr value (see
// internal/redisaddr: host:port, a redis:// or rediss:// URL, or
// comma-separated Cluster seeds).
func redisClient(addr string) (goredis.UniversalClient, error) {
	client, err := redisaddr.Client(addr)
	switch {
	case errors.Is(err, redisaddr.ErrEmpty):
		return nil, &usageError{"no Redis server: set " + redisaddr.Env + " or -redis-addr"}
	case err != nil:
		return nil, &usageError{err.Error()}
	}
	return client, nil
}

// openRedis opens the Redis store. A server whose maxmemory-policy evicts
// keys, which the consumers' store refuses, is opened with -allow-eviction
// only, with a warning to opts.warnings: an operator on managed Redis
// defaults can still inspect and evict.
func openRedis(ctx context.Context, opts options) (admin.Interface, string, func(), error) {
	client, err := redisClient(opts.redisAddr)
	if err != nil {
		return nil, "", nil, err
	}
	if opts.redisPrefix == "" {
		_ = client.Close()
		return nil, "", nil, &usageError{"-redis-prefix must not be empty (the store's default is dedup:)"}
	}
	if opts.pace > 0 {
		paceRedis(client, &pacer{every: opts.pace})
	}
	store, err := dedupredis.New(ctx, dedupredis.Config{Client: client, KeyPrefix: opts.redisPrefix})
	if errors.Is(err, dedupredis.ErrEvictionPolicy) {
		if !opts.allowEviction {
			_ = client.Close()
			return nil, "", nil, &usageError{fmt.Sprintf("Redis at %s: %v; pass -allow-eviction to inspect, list and evict its records anyway", redisaddr.Describe(client), err)}
		}
		if opts.warnings != nil {
			fmt.Fprintf(opts.warnings, "dedupctl: warning: %v\n", err)
		}
		store, err = dedupredis.New(ctx, dedupredis.Config{Client: client, KeyPrefix: opts.redisPrefix, AllowEviction: true})
	}
	if err != nil {
		_ = client.Close()
		return nil, "", nil, fmt.Errorf("Redis at %s: %w", redisaddr.Describe(client), err)
	}
	return store, fmt.Sprintf("Redis at %s, prefix %q", redisaddr.Describe(client), opts.redisPrefix), func() { _ = client.Close() }, nil
}

func openDynamo(ctx context.Context, opts options) (admin.Interface, string, func(), error) {
	a, err := awsenv.LoadAWS(ctx, "dynamodb")
	if err != nil {
		return nil, "", nil, err
	}
	var client dynamo.Client = a.DynamoDB()
	if opts.pace > 0 {
		client = pacedDynamo{Client: a.DynamoDB(), p: &pacer{every: opts.pace}}
	}
	// SkipTTL: an operator's view needs the table, not its TTL.
	store, err := dynamo.New(ctx, dynamo.Config{Client: client, Table: opts.dynamoTable, SkipTTL: true})
	if err != nil {
		if errors.Is(err, dynamo.ErrTableNotFound) || errors.Is(err, dynamo.ErrTableSchema) || errors.Is(err, dynamo.ErrAWSConfig) {
			return nil, "", nil, &usageError{fmt.Sprintf("DynamoDB at %s: %v", a.Describe("dynamodb"), err)}
		}
		return nil, "", nil, fmt.Errorf("DynamoDB at %s: %w", a.Describe("dynamodb"), err)
	}
	return store, fmt.Sprintf("DynamoDB at %s, table %s", a.Describe("dynamodb"), opts.dynamoTable), func() {}, nil
}

func openPostgres(ctx context.Context, opts options) (admin.Interface, string, func(), error) {
	cfg, err := pgx.ParseConfig(opts.pgDSN)
	if err != nil {
		return nil, "", nil, &usageError{fmt.Sprintf("PostgreSQL connection string: %v", err)}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, "", nil, fmt.Errorf("PostgreSQL at %s:%d: %w", cfg.Host, cfg.Port, err)
	}
	closeConn := func() { _ = conn.Close(context.WithoutCancel(ctx)) }
	store, err := postgres.New(ctx, postgres.Config{DB: conn, Table: opts.pgTable, Schema: opts.pgSchema})
	if err != nil {
		closeConn()
		return nil, "", nil, &usageError{err.Error()}
	}
	return store, fmt.Sprintf("PostgreSQL at %s:%d/%s, table %s", cfg.Host, cfg.Port, cfg.Database, store.Table()), closeConn, nil
}
