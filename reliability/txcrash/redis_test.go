package txcrash

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/keys"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/crashtest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// The servers the tests share, started by TestMain in the parent only.
var (
	redisAddr    string
	clusterAddrs []string
	motoEndpoint string
	motoSkip     error // moto_server is not installed
)

func TestMain(m *testing.M) {
	if crashtest.InChild() {
		os.Exit(m.Run())
	}
	testserver.Main(m, func() (func(), error) {
		r, err := testserver.StartRedis()
		if err != nil {
			return nil, err
		}
		c, err := testserver.StartRedisCluster(3)
		if err != nil {
			_ = r.Close()
			return nil, err
		}
		closers := []func(){func() { _ = r.Close() }, func() { _ = c.Close() }}
		redisAddr, clusterAddrs = r.Addr, c.Addrs
		mo, err := testserver.StartMoto()
		switch {
		case err == testserver.ErrMotoMissing:
			motoSkip = err
		case err != nil:
			for _, f := range closers {
				f()
			}
			return nil, err
		default:
			motoEndpoint = mo.Endpoint
			closers = append(closers, func() { _ = mo.Close() })
		}
		return func() {
			for _, f := range closers {
				f()
			}
		}, nil
	})
}

// redisClient is a client of one server, or of the Cluster when addr
// holds several addresses (comma-separated).
func redisClient(addr string) goredis.UniversalClient {
	if addrs := strings.Split(addr, ","); len(addrs) > 1 {
		return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs})
	}
	return goredis.NewClient(&goredis.Options{Addr: addr})
}

// prefix is the test's record prefix: each test and run its own keys.
func prefix(t *testing.T) string {
	return strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(runName(t))) + ":"
}

// chargedKey is the key counting the effects of message i: in the slot of
// its record (the record key as hash tag), as the helper's Tx.HashTag gives.
func chargedKey(store *redis.Store, i int) string {
	return "{" + store.RedisKey(keys.Scoped(scope, keyName(i))) + "}:charged"
}

// redisConsumer handles a message through the dedup middleware; the
// handler's effect is an INCR of the message's charged key, queued on the
// record's transaction (TxMiddleware) or sent by the handler itself.
type redisConsumer struct {
	h message.HandlerFunc
}

func newRedisConsumer(t *testing.T, autoPipeline bool) func(addr string, helper bool) (consumer, error) {
	return func(addr string, helper bool) (consumer, error) {
		client := redisClient(addr)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		store, err := redis.New(ctx, redis.Config{Client: client, KeyPrefix: prefix(t), AutoPipeline: autoPipeline})
		if err != nil {
			return nil, err
		}
		d, err := dedup.New(dedup.Config{Store: store, Key: keyfuncs.JSON("order_id"), Scope: scope, Lease: lease,
			Logger: watermill.NopLogger{}})
		if err != nil {
			return nil, err
		}
		var h message.HandlerFunc
		if helper {
			h = d.Middleware(store.TxMiddleware(func(msg *message.Message) ([]*message.Message, error) {
				tx, ok := redis.TxFromContext(msg.Context())
				if !ok {
					return nil, fmt.Errorf("no transaction")
				}
				k := tx.HashTag() + ":charged"
				_, err := tx.Queue([]string{k}, "incr", k)
				return nil, err
			}))
		} else {
			h = d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				var p struct {
					OrderID string `json:"order_id"`
				}
				if err := json.Unmarshal(msg.Payload, &p); err != nil {
					return nil, err
				}
				k := "{" + store.RedisKey(keys.Scoped(scope, p.OrderID)) + "}:charged"
				return nil, client.Incr(msg.Context(), k).Err()
			})
		}
		return &redisConsumer{h: h}, nil
	}
}

func (c *redisConsumer) handle(ctx context.Context, i int) error {
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"`+keyName(i)+`"}`))
	msg.SetContext(ctx)
	_, err := c.h(msg)
	return err
}

// redisBackend is the parent's view of the test's keys on addr.
func redisBackend(t *testing.T, name, addr string) backend {
	client := redisClient(addr)
	t.Cleanup(func() { _ = client.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, err := redis.New(ctx, redis.Config{Client: client, KeyPrefix: prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	const keys = 1000
	return backend{
		name: name, keys: keys, store: store,
		env: []string{envAddr + "=" + addr},
		effects: func(t *testing.T) []int {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmds := make([]*goredis.StringCmd, keys)
			_, err := client.Pipelined(ctx, func(p goredis.Pipeliner) error {
				for i := range cmds {
					cmds[i] = p.Get(ctx, chargedKey(store, i))
				}
				return nil
			})
			if err != nil && err != goredis.Nil {
				t.Fatalf("reading the effects: %v", err)
			}
			n := make([]int, keys)
			for i, c := range cmds {
				n[i], _ = c.Int()
			}
			return n
		},
	}
}

func TestRedisHelper(t *testing.T) {
	if childMain(t, newRedisConsumer(t, false)) {
		return
	}
	checkHelper(t, redisBackend(t, "redis", redisAddr))
}

func TestRedisWithoutHelper(t *testing.T) {
	if childMain(t, newRedisConsumer(t, false)) {
		return
	}
	checkWithout(t, redisBackend(t, "redis", redisAddr))
}

func TestRedisClusterHelper(t *testing.T) {
	if childMain(t, newRedisConsumer(t, false)) {
		return
	}
	checkHelper(t, redisBackend(t, "redis cluster", strings.Join(clusterAddrs, ",")))
}

func TestRedisClusterWithoutHelper(t *testing.T) {
	if childMain(t, newRedisConsumer(t, false)) {
		return
	}
	checkWithout(t, redisBackend(t, "redis cluster", strings.Join(clusterAddrs, ",")))
}

// The helper's runs with the consumers' claims and completions batched
// (Config.AutoPipeline): the same checks.
func TestRedisHelperAutoPipeline(t *testing.T) {
	if childMain(t, newRedisConsumer(t, true)) {
		return
	}
	checkHelper(t, redisBackend(t, "redis, AutoPipeline", redisAddr))
}

func TestRedisClusterHelperAutoPipeline(t *testing.T) {
	if childMain(t, newRedisConsumer(t, true)) {
		return
	}
	checkHelper(t, redisBackend(t, "redis cluster, AutoPipeline", strings.Join(clusterAddrs, ",")))
}
