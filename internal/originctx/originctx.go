// Package originctx carries the transport ids of a claim (dedup.Origin) on a
// context, for this repository's own code that calls a Store's Claim
// directly (the stores' batch paths, storetest, tests) or an Engine.Do whose
// Call names neither MessageUUID nor MessageID (httpdedup's request id).
// Package dedup reads it in dedup.OriginFromContext; users set
// Call.MessageUUID and Call.MessageID instead.
package originctx

import "context"

// MaxIDLength is the longest id, in bytes, that dedup.OriginFromContext
// returns; longer ids are cut (at a character boundary). Stores size their
// records by it.
const MaxIDLength = 100

// Key is the context key of the origin. Its value is an *IDs (set by With)
// or, on the claim contexts of the engine, the engine's own call.
type Key struct{}

// IDs are the two ids of a dedup.Origin.
type IDs struct {
	TransportID, MessageID string
}

// With returns a context carrying the ids. Cost: one context.WithValue
// (two allocations).
func With(ctx context.Context, transportID, messageID string) context.Context {
	return context.WithValue(ctx, Key{}, &IDs{TransportID: transportID, MessageID: messageID})
}
