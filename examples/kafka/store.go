package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// openStore opens the Redis store on addr (-redis-addr, default
// REDIS_ADDR: host:port or a redis:// URL; empty: an in-process miniredis).
func openStore(ctx context.Context, addr string) (dedup.Store, string, func(), error) {
	client, about, stop, err := openRedis(addr)
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
