// Package httpdedup is a net/http middleware for the Idempotency-Key
// header (IETF httpapi draft "The Idempotency-Key HTTP Header Field",
// with Stripe's behaviour as the practical reference), on the same
// dedup.Store as the Watermill middleware: one Redis, DynamoDB or PostgreSQL
// store serves message consumers, APIs and webhook receivers.
//
//	idem, err := httpdedup.New(httpdedup.Config{
//		Dedup:    dedup.Config{Store: store}, // e.g. stores/redis; the engine's settings
//		Identity: accountFromContext,         // who is calling: part of every record's scope
//	})
//	mux.Handle("POST /payments", idem.Require(payments))
//
// For each request with a key, the record's key is
// admin.ScopedKey(Scope(identity, method, route), key), so a key shared by
// two callers, two routes or two methods never replays the other's
// response. The first request claims the record and runs the handler with a
// buffering ResponseWriter; a storable response (2xx and most 4xx, see
// DefaultStoreResponse) is completed into the record (see EncodeResponse)
// before it is sent, and later requests with the same key and the same
// fingerprint get it replayed byte for byte with Idempotent-Replayed: true.
// 5xx responses and panics release the claim, so the client's retry runs
// the handler again.
//
// Refusals are RFC 9457 problem+json: 400 for a missing (Require) or
// malformed key, 401 when the caller cannot be identified, 409 with
// Retry-After while the key is in flight, 413 for a body over the limit, 422
// when the key was used for a different request, 500 when the handler
// streamed, hijacked or wrote too much, 503 with Retry-After when the store
// cannot be reached (nothing runs without a claim).
//
// With the PostgreSQL store, Config.InTransaction (store.RunInTx) runs the
// handler in a database transaction in which the response is stored and
// the key completed: the handler's rows and the record commit together.
//
// Logging: with Config.Dedup.Logger unset, the server's problems
// (store_error, claim_lost, fail_open) reach log/slog's default logger at
// error level (dedup.DefaultLogger) and nothing else is logged; a
// client's problems are info-level lines of a Logger you set.
// watermill.NopLogger{} logs nothing.
//
// Webhook receivers use the provider's event id as the key (HeaderKey with
// the provider's header, or BodyKey with a keyfuncs function) and a
// StaticIdentity.
//
// See README.md in this directory for the semantics in full, the stored
// encoding and the problem types.
package httpdedup
