package soak

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// The consumer process: the test binary re-executed with envRole set. It
// runs a Watermill router whose handlers each read the stream through
// their own member of the consumer group, deduplicate with the middleware
// on the store under test, and write each effect as a row of the effects
// table. It reports on its standard output, and exits when its standard
// input closes (the parent died) or when killed.
const (
	envRole        = "SOAK_ROLE"
	envBroker      = "SOAK_BROKER"      // the broker's redis-server
	envStream      = "SOAK_STREAM"      // the stream
	envStore       = "SOAK_STORE"       // "redis" or "postgres"
	envStoreAddr   = "SOAK_STORE_ADDR"  // the Redis store's redis-server
	envDSN         = "SOAK_DSN"         // PostgreSQL: the effects table, and the PostgreSQL store
	envSchema      = "SOAK_SCHEMA"      // their schema
	envName        = "SOAK_NAME"        // the consumer's name, unique for the run
	envSubscribers = "SOAK_SUBSCRIBERS" // handlers, each a member of the group
	envCompletions = "SOAK_COMPLETIONS" // file of the tokens this consumer completed
	envStatsEvery  = "SOAK_STATS_EVERY" // report memory and goroutines every this many messages (0: never)
)

const (
	group  = "soak"
	scope  = "soak-orders"
	lease  = 2 * time.Second
	prefix = "soak:"

	readyLine = "SOAK_READY"
	statsLine = "SOAK_STATS" // SOAK_STATS <messages> <rss bytes> <goroutines> <heap in use bytes>
)

func runConsumer() error {
	subscribers, err := strconv.Atoi(os.Getenv(envSubscribers))
	if err != nil {
		return fmt.Errorf("%s: %w", envSubscribers, err)
	}
	statsEvery, _ := strconv.ParseInt(os.Getenv(envStatsEvery), 10, 64)
	name := os.Getenv(envName)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // the parent holds our standard input: it ends when the parent does
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(3)
	}()

	pgConfig, err := pgxpool.ParseConfig(os.Getenv(envDSN))
	if err != nil {
		return err
	}
	pgConfig.MaxConns = int32(2*subscribers + 2) // the default, 4 on 2 cores, would make the handlers queue for a connection
	pool, err := pgxpool.NewWithConfig(ctx, pgConfig)
	if err != nil {
		return err
	}
	schema := os.Getenv(envSchema)
	insert := fmt.Sprintf(`INSERT INTO %q.effects (key, token, consumer) VALUES ($1, $2, $3)`, schema)

	var store dedup.Store
	switch os.Getenv(envStore) {
	case "redis":
		client := goredis.NewClient(&goredis.Options{Addr: os.Getenv(envStoreAddr), PoolSize: 4 * subscribers})
		s, err := redis.New(ctx, redis.Config{Client: client, KeyPrefix: prefix})
		if err != nil {
			return err
		}
		store = s
	case "postgres":
		s, err := postgres.New(ctx, postgres.Config{DB: pool, Schema: schema})
		if err != nil {
			return err
		}
		store = s
	default:
		return fmt.Errorf("%s=%q", envStore, os.Getenv(envStore))
	}
	log, err := os.OpenFile(os.Getenv(envCompletions), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	store = &loggedStore{Store: store, log: log}

	d, err := dedup.New(dedup.Config{Store: store, Key: keyfuncs.JSON("order_id"), Scope: scope, Lease: lease, Retention: time.Hour})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	var handled, failed atomic.Int64
	var statsMu sync.Mutex
	count := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil && !errors.Is(err, dedup.ErrInProgress) && failed.Add(1) <= 20 {
				fmt.Fprintf(os.Stderr, "%s: %v\n", name, err) // the parent shows these when the run fails
			}
			if n := handled.Add(1); statsEvery > 0 && n%statsEvery == 0 {
				statsMu.Lock()
				fmt.Printf("%s %d %d %d %d\n", statsLine, n, rss(), runtime.NumGoroutine(), heapInUse())
				statsMu.Unlock()
			}
			return out, err
		}
	}
	work := func(msg *message.Message) error {
		held, ok := dedup.HeldClaimFromContext(msg.Context())
		if !ok {
			return errors.New("the handler runs without a claim")
		}
		c := held.Claim()
		_, err := pool.Exec(msg.Context(), insert, c.Key, hex.EncodeToString([]byte(c.Token)), name)
		return err
	}
	broker := goredis.NewClient(&goredis.Options{Addr: os.Getenv(envBroker), PoolSize: 2*subscribers + 4})
	for i := 0; i < subscribers; i++ {
		sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
			Client:                        broker,
			ConsumerGroup:                 group,
			Consumer:                      fmt.Sprintf("%s-%d", name, i),
			NackResendSleep:               50 * time.Millisecond,
			ClaimInterval:                 time.Second,
			MaxIdleTime:                   3 * time.Second,
			DisableIndefiniteInitialBlock: true,
		}, watermill.NopLogger{})
		if err != nil {
			return err
		}
		h := count(d.Middleware(func(msg *message.Message) ([]*message.Message, error) { return nil, work(msg) }))
		router.AddNoPublisherHandler(fmt.Sprintf("h%d", i), os.Getenv(envStream), sub, func(msg *message.Message) error {
			_, err := h(msg)
			return err
		})
	}
	go func() {
		<-router.Running()
		fmt.Println(readyLine)
	}()
	return router.Run(ctx)
}

// loggedStore writes the token (in hex, as the effects table has it: the
// Redis store's tokens are binary) of every completion the store acknowledged
// to the completions file, with one write system call right after the
// store's reply: a consumer SIGKILLed after that call has the line in the
// file (the kernel has it); one killed before has not, and the parent
// counts its effect's record as not completed when it was killed.
type loggedStore struct {
	dedup.Store
	mu  sync.Mutex
	log *os.File
}

func (s *loggedStore) Complete(ctx context.Context, c dedup.Claim, result []byte, retention time.Duration) error {
	err := s.Store.Complete(ctx, c, result, retention)
	if err == nil || errors.Is(err, dedup.ErrAlreadyCompleted) {
		s.mu.Lock()
		_, _ = s.log.WriteString(hex.EncodeToString([]byte(c.Token)) + "\n")
		s.mu.Unlock()
	}
	return err
}

// rss is the process's resident set size (VmRSS), in bytes.
func rss() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func heapInUse() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
