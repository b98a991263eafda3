// Package redis is a dedup.Store on Redis 7.0 or newer (go-redis v9): one
// Redis string per record, expiry by Redis' own PX, a claim in one round
// trip (SET key value NX PX lease GET) and token-checked Lua scripts for
// Complete (compare-and-set), Release (compare-and-delete) and Extend
// (compare-and-pexpire).
//
// It takes a go-redis UniversalClient, so a single server, Sentinel
// (redis.NewFailoverClient) and Cluster (redis.NewClusterClient) work
// unchanged:
//
//	client := goredis.NewClient(&goredis.Options{Addr: "localhost:6379"})
//	store, err := redis.New(ctx, client, redis.Config{}) // keys "dedup:<scope>:<key>"
//	if err != nil {
//		return err // unreachable, or older than Redis 7.0 (ErrServerTooOld)
//	}
//	d, err := dedup.New(dedup.Config{Store: store, Key: keyfuncs.JSON("order_id")})
//
// The package name clashes with go-redis' own; import one of them under
// another name (goredis above).
//
// See README.md in this directory for the key layout, the record encoding,
// the benchmark figures and how to run Redis for local development.
package redis
