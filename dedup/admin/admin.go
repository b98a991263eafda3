// Package admin is the operator's view of a dedup store: look at one
// record, delete one, list records by key prefix, summarize a scope
// (Summarize). It is optional and
// separate from dedup.Store: the middleware never uses it. The stores of
// this module implement Interface (the memory store too); cmd/dedupctl
// drives it from the command line.
package admin

import (
	"context"
	"errors"
	"time"

	"github.com/watermill-dedup/watermill-dedup/internal/keys"
)

// Interface is implemented by the stores of this module.
//
// Keys are scoped keys as given to Store.Claim ([ScopedKey]), without any
// prefix a store adds of its own (the Redis store's KeyPrefix). Every method
// sees the records a Claim would see: a record past its lease or retention,
// or released, counts as absent, even while the store still holds it
// (PostgreSQL and DynamoDB delete expired rows and items late).
type Interface interface {
	// Inspect returns the live record under key, or an error wrapping
	// ErrNotFound when there is none. A value the store cannot decode gives
	// an error that says why (e.g. the Redis store's ErrUnknownFormat).
	// One round trip; it never changes the record.
	Inspect(ctx context.Context, key string) (Record, error)

	// Evict deletes the record under key whatever its state and owner
	// token: an operator's override, for a message that must be let through
	// again. It reports whether a live record was deleted (false: there was
	// none; an expired leftover is deleted too but does not count).
	//
	// Consequences: the next delivery of the key runs the handler again,
	// so its effect happens a second time if it had already happened. If
	// the record was in progress, the consumer holding it keeps running;
	// its Complete, Release and Extend then fail with ErrClaimLost (the
	// middleware logs claim_lost), and a redelivery may run concurrently
	// with it. One round trip.
	Evict(ctx context.Context, key string) (bool, error)

	// List returns up to limit live records whose scoped key starts with
	// prefix ("" lists everything; [ScopePrefix] gives one scope's prefix),
	// and the cursor to pass to the next call. Start with cursor "". An
	// empty next cursor means the listing is complete; a page may hold
	// fewer than limit records, even none, while more follow, so only the
	// empty cursor means the end. Records created or deleted while paging
	// may or may not be listed; a record that lives throughout is listed at
	// least once (Redis SCAN may list it twice). limit must be between 1
	// and MaxListLimit. A cursor that the store did not issue gives an
	// error wrapping ErrInvalidCursor.
	//
	// Cost depends on the store, and none of them has an index on key
	// prefixes: see each store's List. Listing a small prefix of a large
	// store reads (and, on DynamoDB, pays for) the whole keyspace over the
	// pages.
	List(ctx context.Context, prefix, cursor string, limit int) (records []Record, next string, err error)
}

// Record is what an operator sees of one record.
type Record struct {
	// Key is the scoped key. The DynamoDB store's List gives the partition
	// key, which for keys longer than 512 bytes is the key's beginning
	// followed by a digest of the whole key (dynamo.PartitionKey).
	Key string
	// State is StateInProgress or StateCompleted; List reports a value it
	// cannot decode as StateUnreadable, with Problem saying why.
	State string
	// Fingerprint is the fingerprint as the store keeps it: verbatim
	// (memory; PostgreSQL when it is valid UTF-8 without NUL, else
	// "\x01sha256:<hex>"), verbatim when short and "sha256:<hex>" otherwise
	// (DynamoDB), or the hex of a 16-byte digest of it (Redis). Empty when
	// the claim had none.
	Fingerprint string
	// ResultSize is the length in bytes of the stored result (0 for none).
	ResultSize int
	// Created is when the claim that created the record (or took it over)
	// ran. The zero time when the store does not record it (Redis,
	// DynamoDB, memory).
	Created time.Time
	// ClaimedAt is when the record's first claim ran: the first of the
	// Claims, kept across releases and takeovers (on the PostgreSQL
	// server's clock; the claiming client's elsewhere). Zero for a record
	// written by a version that did not keep it, or completed by a Redis
	// store with Config.OmitProvenance.
	ClaimedAt time.Time
	// CompletedAt is when the record was completed (by the clock of
	// ClaimedAt); zero while in progress, or where ClaimedAt is zero.
	CompletedAt time.Time
	// TransportID and MessageID are the Origin of the first claim
	// (dedup.Origin): the Watermill message UUID or Lambda record id, and
	// the broker's message id (the SQS MessageId). Empty when the claim
	// had none.
	TransportID, MessageID string
	// Claims is how many claims acquired the key since its first claim: 1,
	// plus one per retry after a release and per takeover of an abandoned
	// lease, where the store still held the record (a Redis record whose
	// lease ended is gone: its count starts again). 0 where ClaimedAt is
	// zero.
	Claims int
	// ResponseStatus is the HTTP status of the stored response of a record
	// httpdedup completed (dedup.RecordDetails), where the store keeps it
	// (PostgreSQL, memory); 0 while in progress, for a record that is not
	// an HTTP response, and on the stores that do not keep it (Redis,
	// DynamoDB).
	ResponseStatus int
	// Remaining is what is left of the lease (in progress) or of the
	// retention (completed) when the record was read, by the clock that
	// decides expiry in that store (the Redis or PostgreSQL server's, the
	// DynamoDB store's Clock, the memory store's Clock). Always positive for
	// a live record.
	Remaining time.Duration
	// Problem says why a record is StateUnreadable, or what else is wrong
	// with it (a Redis record without a TTL, which never expires); empty
	// otherwise.
	Problem string
}

// Record states as reported by an Admin.
const (
	StateInProgress = "in_progress"
	StateCompleted  = "completed"
	// StateUnreadable: List found a value under the key prefix that the
	// store cannot decode (a foreign value, or a newer record format).
	StateUnreadable = "unreadable"
)

// MaxListLimit is the largest page Interface.List accepts.
const MaxListLimit = 1000

var (
	// ErrNotFound: Interface.Inspect found no live record under the key.
	ErrNotFound = errors.New("dedup/admin: no record under the key")

	// ErrInvalidCursor: Interface.List was given a cursor it did not issue (or
	// one issued for another prefix or store).
	ErrInvalidCursor = errors.New("dedup/admin: invalid list cursor")
)

// ScopePrefix returns the prefix shared by every scoped key of scope:
// ScopedKey(scope, k) starts with ScopePrefix(scope) for every k, and no key
// of another scope does (the scope is escaped, so "a" does not match the
// keys of scope "a:b").
func ScopePrefix(scope string) string {
	return keys.Scoped(scope, "")
}

// ScopedKey returns the record key of a business key within a scope, as the
// engine claims it: the scope, escaped ("%" → "%25", ":" → "%3A", so that
// the first ":" always ends it), then ":" then the business key verbatim:
// "charge-orders:ORDER-003". Stores add their own prefix on top (the Redis
// store's KeyPrefix).
func ScopedKey(scope, key string) string {
	return keys.Scoped(scope, key)
}

// SplitScopedKey returns the scope (unescaped) and the business key of a
// record key made by ScopedKey, for a store that keeps them apart (the
// PostgreSQL store's readable columns) and for tools that show them. A
// record key without ":" (not made by ScopedKey) has an empty scope and is
// its own business key. Cost: no allocation unless the scope was escaped.
func SplitScopedKey(record string) (scope, key string) {
	return keys.Split(record)
}
