package redis

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// minMajor is the oldest Redis major version the store runs on: 7.0 is the
// first that accepts SET with both NX and GET.
const minMajor = 7

// checkServers runs check on every server the client sends keys to (every
// master of a Cluster, every shard of a Ring, the one server or the current
// Sentinel master otherwise), possibly concurrently, and joins every
// problem.
func checkServers(ctx context.Context, client goredis.UniversalClient, check func(ctx context.Context, c goredis.Cmdable, addr string) error) error {
	switch c := client.(type) {
	case *goredis.ClusterClient:
		return forEachCollect(check, func(fn func(context.Context, *goredis.Client) error) error {
			return c.ForEachMaster(ctx, fn)
		})
	case *goredis.Ring:
		return forEachCollect(check, func(fn func(context.Context, *goredis.Client) error) error {
			return c.ForEachShard(ctx, fn)
		})
	case *goredis.Client:
		addr := c.Options().Addr
		if addr == "FailoverClient" { // what redis.NewFailoverClient puts there
			addr = "the Sentinel master"
		}
		return check(ctx, c, addr)
	default:
		return check(ctx, client, "the server")
	}
}

// forEachCollect runs check on every node forEach visits (possibly
// concurrently) and joins every problem.
func forEachCollect(check func(ctx context.Context, c goredis.Cmdable, addr string) error, forEach func(fn func(context.Context, *goredis.Client) error) error) error {
	var (
		mu   sync.Mutex
		errs []error
	)
	err := forEach(func(ctx context.Context, node *goredis.Client) error {
		if err := check(ctx, node, node.Options().Addr); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("dedup/redis: listing the servers to check: %w", err))
	}
	return errors.Join(errs...)
}

func checkVersion(ctx context.Context, c goredis.Cmdable, addr string) error {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return &VersionError{Addr: addr, Err: err}
	}
	return versionFromInfo(info, addr)
}

// versionFromInfo checks the redis_version field of an INFO reply.
func versionFromInfo(info, addr string) error {
	version := ""
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "redis_version:"); ok {
			version = v
			break
		}
	}
	if version == "" {
		return &VersionError{Addr: addr, Err: errors.New("INFO server has no redis_version field")}
	}
	majorText, _, _ := strings.Cut(version, ".")
	major, err := strconv.Atoi(majorText)
	if err != nil {
		return &VersionError{Addr: addr, Version: version, Err: errors.New("cannot parse the major version")}
	}
	if major < minMajor {
		return &VersionError{Addr: addr, Version: version, Err: ErrServerTooOld}
	}
	return nil
}
