// Package redis is a dedup.Store on Redis 7.0 or newer (go-redis v9): one
// Redis string per record, expiry by Redis' own PX, a claim in one round
// trip (SET key value NX PX lease GET) and token-checked Lua scripts for
// Complete (compare-and-set), Release (compare-and-set to a released
// record, which the next claim takes over and counts) and Extend
// (compare-and-pexpire).
//
// It takes a go-redis UniversalClient, so a single server, Sentinel
// (redis.NewFailoverClient) and Cluster (redis.NewClusterClient) work
// unchanged:
//
//	import (
//		"github.com/redis/go-redis/v9"
//
//		dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
//	)
//
//	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	store, err := dedupredis.New(ctx, dedupredis.Config{Client: client}) // keys "dedup:<scope>:<key>"
//	if err != nil {
//		return err // unreachable, or older than Redis 7.0 (ErrServerTooOld)
//	}
//	d, err := dedup.New(dedup.Config{Store: store, Key: keyfuncs.JSON("order_id")})
//
// # The package name
//
// The package is named redis, like go-redis' own, and a file that uses both
// must rename one import. Import this one as dedupredis, as above; go-redis
// keeps its own name. The name stays redis because a Go package is named
// after the last element of its import path (stores/redis, beside
// stores/dynamo and stores/postgres), renaming it would break every
// program that imports it, and Watermill itself keeps colliding names (its
// watermill-sql package is sql, like database/sql). The alias goes on this
// package rather than on go-redis because a program that adds
// deduplication already calls go-redis as redis in many places and calls
// this package in one: the alias changes that one line only.
//
// # The effect and its record in one step
//
// A handler whose effect is written to this Redis can have it run in the
// same atomic step as the completion of its record, and only if its claim
// is still valid: Store.TxMiddleware (Watermill) and Store.RunInTx
// (Engine.Do) run the commands the handler queued on its Tx
// (TxFromContext, Tx.Queue) and the completion in one Lua script. On a
// Cluster the commands' keys must be in the record's slot (Tx.HashTag).
// The guide docs/effect-in-transaction.md puts it beside DynamoDB and
// PostgreSQL.
//
// See README.md in this directory for the key layout, the record encoding,
// the benchmark figures and how to run Redis for local development.
package redis
