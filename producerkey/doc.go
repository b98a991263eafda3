// Package producerkey gives each intent of a producer one idempotency key,
// reused on every retry of that intent and never shared by two intents, so
// that the consumer (a dedup.Deduplicator, httpdedup) can tell a retry from
// a new request.
//
// A retry is the producer's own duplicate: Publish timed out after the
// broker stored the message, an HTTP reply was lost after the server ran the
// effect. If the retry carries a new key (a new Watermill UUID, a new random
// Idempotency-Key per attempt), the consumer sees two requests and runs the
// effect twice. The key must be chosen once per intent, before the first
// attempt:
//
//   - Publisher decorates a Watermill message.Publisher: it stamps the key
//     into the message's metadata on the first Publish of the message and
//     leaves it there, so publishing the same message again carries the same
//     key. With PublisherConfig.Key (say keyfuncs.JSON("order_id")) the key
//     is the business key, so even a message rebuilt for a retry gets the
//     same one. Consumers read it with keyfuncs.Metadata(DefaultMetadata).
//   - Transport is an http.RoundTripper that sets the Idempotency-Key header
//     of POST and PATCH requests. One intent is marked on the request's
//     context with NewIntent (a random key made on first use) or WithKey (a
//     key of the caller's): every request made with that context, that is
//     every retry of a retrying client wrapper, carries the same key.
//     Without a marked intent each RoundTrip call is one intent, which is
//     right when retries happen below the Transport (in its Base).
//
// Keys are 128 random bits from crypto/rand, hex encoded, unless the caller
// derives them from the business fact.
package producerkey
