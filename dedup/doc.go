// Package dedup gives at-least-once Watermill consumers exactly-once effects.
//
// A [Deduplicator] is a router middleware. For every message it takes a
// business key out of the message with Config.Key (an order id, a payment
// id, never the transport message id; package keyfuncs has ready-made
// ones), claims that key atomically in a shared [Store] before the handler
// runs, marks it completed after the handler succeeds, and releases it
// when the handler fails, so that a redelivered or re-published copy of
// the same business fact is acknowledged without running the handler a
// second time.
//
// The claim lifecycle lives once, in the [Engine]: claim, a heartbeat that
// extends the lease until Complete is acknowledged, cancellation of the
// work's context at the lease deadline, Complete with retries or Release,
// one [Decision] per outcome. The Deduplicator, package httpdedup and the
// Lambda adapter are entry points on it; plain Go code calls [Engine.Do]
// to run a function at most once per key, and [Engine.DoBatch] to claim a
// whole batch in one store request (stores that implement [BatchStore]).
//
// Every decision is a line of Config.Logger and a call of Config.Observer.
// With no Logger set, the lines at error level (messages refused for good,
// store errors, lost claims) reach log/slog's default logger
// ([DefaultLogger]) and nothing else is logged or built;
// watermill.NopLogger{} logs nothing. A message refused for good that
// keeps coming back (a router without a poison queue) is logged once and
// then counted, whatever the Logger.
//
// The package imports no store and no broker. Stores live in their own
// packages (stores/memory for tests and single-process use, stores/redis,
// stores/dynamo, stores/postgres) and must pass the conformance suite in
// dedup/storetest; package dedup/admin is the operator's view of a store.
//
// The contract every store implements:
//
//   - Claim(key, fingerprint, lease) is one atomic operation: Acquired (with a
//     fresh owner token), Duplicate (with the stored result), InProgress or
//     Conflict (the key was claimed with a different fingerprint). A record
//     past its lease (in progress) or its retention (completed) counts as no
//     record.
//   - Complete, Release and Extend act only while the record still carries the
//     claim's token; otherwise they return [ErrClaimLost] and change nothing.
//
// Two durations, never one: the lease bounds how long a crashed consumer
// holds a key; the retention bounds how long a completed key suppresses
// duplicates.
package dedup
