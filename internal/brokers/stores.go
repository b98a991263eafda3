package brokers

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
	redisstore "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// RedisAddrEnv names the environment variable with the Redis server to use:
// "host:port" or a redis:// / rediss:// URL.
const RedisAddrEnv = "REDIS_ADDR"

// Redis is a Redis server: the one named by REDIS_ADDR, or an in-process
// miniredis.
type Redis struct {
	Client *goredis.Client
	// Addr is the server's address.
	Addr string
	// Embedded reports whether the server is an in-process miniredis.
	Embedded bool

	mini *miniredis.Miniredis
}

// ConnectRedis connects to addr ("host:port" or a redis:// or rediss://
// URL; typically the value of REDIS_ADDR), or starts an embedded miniredis
// (StartMiniredis) when addr is empty. It makes no request.
func ConnectRedis(addr string) (*Redis, error) {
	addr = strings.TrimSpace(addr)
	if addr == "" {
		return StartMiniredis()
	}
	opts := &goredis.Options{Addr: addr}
	if strings.Contains(addr, "://") {
		var err error
		if opts, err = goredis.ParseURL(addr); err != nil {
			return nil, fmt.Errorf("brokers: Redis address %q: %w", addr, err)
		}
	}
	return &Redis{Client: goredis.NewClient(opts), Addr: opts.Addr}, nil
}

// miniredisVersion is what the embedded server reports as redis_version.
// miniredis implements the Redis 7 commands the store uses (SET with NX, PX
// and GET together; EVALSHA with the Lua string library), which
// TestMiniredisConformance checks with the store conformance suite; its own
// INFO has no server section, so the version check would refuse it.
const miniredisVersion = "7.2.0"

// StartMiniredis starts an in-process miniredis on a free 127.0.0.1 port
// whose TTLs follow the wall clock and which answers INFO server with a
// Redis 7 version. It keeps everything in memory and is gone when the
// process exits: for demos that need no server, not for sharing records
// between processes. Call Close to stop it.
//
// miniredis only expires keys when told to. ClockTTL makes it age every TTL
// by the time elapsed since the previous command, at the start of each
// command, so a key is never aged by time that passed before it was set.
// (A ticker calling FastForward did that: when the ticker goroutine ran
// late, its catch-up step expired keys set just before it at once, and until
// then expired keys lived on; a busy 2-core machine under -race saw lags of
// a second.) Cost: each command walks the keys to age them, which is fine for
// a demo's few thousand keys.
func StartMiniredis() (*Redis, error) {
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	if err := m.Start(); err != nil {
		return nil, fmt.Errorf("brokers: starting miniredis: %w", err)
	}
	m.Server().SetPreHook(func(c *server.Peer, cmd string, args ...string) bool {
		if cmd == "INFO" && len(args) == 1 && strings.EqualFold(args[0], "server") {
			c.WriteBulk("# Server\r\nredis_version:" + miniredisVersion + "\r\nredis_mode:standalone\r\nexecutable:miniredis\r\n")
			return true
		}
		return false
	})
	return &Redis{
		Client:   goredis.NewClient(&goredis.Options{Addr: m.Addr()}),
		Addr:     m.Addr(),
		Embedded: true,
		mini:     m,
	}, nil
}

// Describe names the server for output lines.
func (r *Redis) Describe() string {
	if r.Embedded {
		return "embedded Redis (miniredis, in this process) at " + r.Addr
	}
	return "Redis at " + r.Addr
}

// Store returns a Redis store on the server (it checks the server version:
// one round trip).
func (r *Redis) Store(ctx context.Context, config redisstore.Config) (*redisstore.Store, error) {
	return redisstore.New(ctx, r.Client, config)
}

// Close closes the client and stops the embedded server.
func (r *Redis) Close() {
	_ = r.Client.Close()
	if r.mini != nil {
		r.mini.Close()
	}
}

// DynamoStore returns a DynamoDB store on table, creating the table when it
// does not exist (on-demand billing; TTL enabled where the server supports
// it, which dynalite does not: the store never relies on TTL).
func (a *AWS) DynamoStore(ctx context.Context, table string) (*dynamo.Store, error) {
	client := a.DynamoDB()
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
	return dynamo.New(dynamo.Config{Client: client, Table: table})
}
