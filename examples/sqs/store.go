package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// openStore opens the dedup store: Redis (-redis-addr, default REDIS_ADDR:
// host:port or a redis:// URL; unset, an in-process miniredis) or DynamoDB
// (the AWS SDK's environment; the table is created when missing).
func openStore(ctx context.Context, cfg config) (dedup.Store, string, func(), error) {
	if cfg.store == "dynamo" {
		return openDynamo(ctx, cfg.dynamoTable)
	}
	client, about, stop, err := openRedis(cfg.redisAddr)
	if err != nil {
		return nil, "", nil, err
	}
	s, err := dedupredis.New(ctx, dedupredis.Config{Client: client})
	if err != nil {
		stop()
		return nil, "", nil, err
	}
	return s, about, stop, nil
}

// openRedis connects to addr, or starts an in-process miniredis when addr
// is empty (records then live only as long as this process).
func openRedis(addr string) (*goredis.Client, string, func(), error) {
	if addr != "" {
		opts := &goredis.Options{Addr: addr}
		if strings.Contains(addr, "://") {
			var err error
			if opts, err = goredis.ParseURL(addr); err != nil {
				return nil, "", nil, fmt.Errorf("Redis address: %w", err)
			}
		}
		c := goredis.NewClient(opts)
		return c, "Redis at " + opts.Addr, func() { _ = c.Close() }, nil
	}
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true) // expire keys by the wall clock
	if err := m.Start(); err != nil {
		return nil, "", nil, err
	}
	// The store checks the server's version with INFO server, which
	// miniredis does not answer; it implements the Redis 7 commands the
	// store uses.
	m.Server().SetPreHook(func(c *server.Peer, cmd string, args ...string) bool {
		if cmd == "INFO" && len(args) == 1 && strings.EqualFold(args[0], "server") {
			c.WriteBulk("# Server\r\nredis_version:7.2.0\r\n")
			return true
		}
		return false
	})
	c := goredis.NewClient(&goredis.Options{Addr: m.Addr()})
	about := "embedded Redis (miniredis, in this process) at " + m.Addr() + " (set REDIS_ADDR to share records between processes)"
	return c, about, func() { _ = c.Close(); m.Close() }, nil
}

// openDynamo returns a DynamoDB store on table, creating the table when it
// does not exist.
func openDynamo(ctx context.Context, table string) (dedup.Store, string, func(), error) {
	awsCfg, err := loadAWS(ctx, "dynamodb")
	if err != nil {
		return nil, "", nil, &hintError{err, dynaliteHint}
	}
	client := dynamodb.NewFromConfig(awsCfg)
	err = dynamo.CreateTable(ctx, client, dynamo.TableConfig{Table: table, SkipTTL: true})
	var inUse *types.ResourceInUseException
	switch {
	case err == nil:
		// Best effort: TTL only frees storage, and emulators lack it.
		_ = dynamo.EnableTTL(ctx, client, table, dynamo.DefaultTTLAttribute)
	case errors.As(err, &inUse):
		// The table exists.
	default:
		return nil, "", nil, &hintError{fmt.Errorf("dynamodb at %s: %w", where(awsCfg, "dynamodb"), err), dynaliteHint}
	}
	// SkipTTL: TTL is best effort above (emulators lack it).
	s, err := dynamo.New(ctx, dynamo.Config{Client: client, Table: table, SkipTTL: true})
	if err != nil {
		return nil, "", nil, err
	}
	return s, fmt.Sprintf("DynamoDB table %s at %s", table, where(awsCfg, "dynamodb")), func() {}, nil
}
