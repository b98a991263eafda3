package storekit

import "github.com/watermill-dedup/watermill-dedup/internal/fanout"

// Each calls fn(i) for every i in [0, n), at most limit at once (limit < 1
// means one at a time), and returns when every call has returned. For a
// store's batch method that sends one request per record (DynamoDB's
// conditional writes). fn must not panic.
func Each(n, limit int, fn func(i int)) { fanout.Each(n, limit, fn) }

// EachInKeyOrder is Each for requests on keys (keys[i] is request i's):
// requests on distinct keys run concurrently, at most limit at once, and a
// request on a key that an earlier request also names starts only after
// that one returned, so that the requests of one key run in their order
// (the same key twice in one ClaimBatch is claimed as if one claim followed
// the other).
func EachInKeyOrder(keys []string, limit int, fn func(i int)) { fanout.EachInKeyOrder(keys, limit, fn) }
