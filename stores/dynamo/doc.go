// Package dynamo is a [dedup.Store] on Amazon DynamoDB (aws-sdk-go-v2), for
// consumers that already run on AWS and want no other server.
//
// # Item layout
//
// One item per scoped key, in a table with a string partition key and no
// sort key (attribute names are configurable, see AttributeNames):
//
//	pk           S  the scoped key, or for keys over 512 bytes
//	                "<first ≤512 bytes>…#sha256:<hex of the whole key>" (PartitionKey)
//	state        S  "in_progress" | "completed" | "released"
//	token        S  owner token of the claim that wrote the item (32 hex)
//	fingerprint  S  the claim's fingerprint, absent when empty; over 64 bytes
//	                (or not UTF-8) stored as "sha256:<hex>"
//	deadline     N  Unix milliseconds: lease end (in_progress) or retention
//	                end (completed), by the writer's clock
//	result       B  Complete's result, absent when empty
//	ttl          N  epoch seconds >= deadline + ClockSkewMargin, for DynamoDB TTL
//	claimed_at   S  the first claim's time (RFC 3339 UTC, milliseconds)
//	completed_at S  when it was completed, absent while in progress
//	transport_id S  the first claim's dedup.Origin.TransportID, absent when empty
//	message_id   S  the first claim's dedup.Origin.MessageID, absent when empty
//	claims       N  how many claims acquired the record
//	fence        N  the fence of the claim that last acquired the record
//	                (dedup.Claim.Fence); absent in items written before
//	                fencing (fence 0)
//
// # Operations
//
// Every write is conditional, atomic in DynamoDB:
//
//   - Claim: PutItem if attribute_not_exists(pk), the one request of a key
//     without a record, with ReturnValuesOnConditionCheckFailure=ALL_OLD
//     (on every claim write) so that DynamoDB returns the live record in
//     the same round trip. Servers that ignore that flag (dynalite) cost
//     one strongly consistent GetItem more. A record no longer live costs
//     one write more: a released or abandoned item is taken over by an
//     UpdateItem if attribute_not_exists(pk) OR (deadline < now-margin AND
//     state <> completed AND fence below the new one), keeping its
//     who-and-when attributes (if_not_exists) and counting the claim; a
//     completed item past its retention is replaced by a PutItem (if
//     attribute_not_exists(pk) OR (deadline < now-margin AND fence below
//     the new one)): a new count.
//   - Complete: UpdateItem (state, deadline, ttl, completed_at, result) if
//     token = :token AND state = in_progress AND deadline > now.
//   - Extend: UpdateItem (deadline, ttl) under the same condition.
//   - Release: UpdateItem (state = released, deadline = 0) under the same
//     condition.
//
// A failed owner condition is [dedup.ErrClaimLost], wrapping the SDK's
// *types.ConditionalCheckFailedException; every other error keeps the SDK's
// error for errors.As and means the outcome is unknown. Conditions are built
// with feature/dynamodb/expression. The IAM policy needs dynamodb:PutItem,
// GetItem, UpdateItem and DeleteItem on the table, and DescribeTable and
// DescribeTimeToLive for the check New makes once (see
// Config.SkipTableCheck).
//
// # Expiry, clocks and TTL
//
// Expiry is decided by the conditions, never by DynamoDB TTL: TTL deletes
// items up to days after they expire, and until then they still show up in
// reads. DynamoDB has no server clock in conditions, so "now" is the
// calling client's clock. The owner stops at its deadline; another client
// takes over only ClockSkewMargin (default 1s) after it, so clocks may
// differ by up to the margin without two owners at once. Keep hosts on NTP
// (Amazon Time Sync) and raise the margin if they may drift further.
//
// The ttl attribute exists so that DynamoDB TTL can reclaim storage: enable
// TTL on it (CreateTable does, EnableTTL does for an existing table).
// Without TTL the store stays correct but expired items are kept forever.
//
// # Fences
//
// Every won claim carries a fence (dedup.Claim.Fence), written with the
// claim in the same request: storekit.NextFence of the item's fence and
// the store's Clock, so a key without an item gets the clock's
// microseconds and its claim stays one PutItem. While the item exists,
// each winner's fence is larger than the last by construction (the
// takeover writes require the stored fence to be below the new one).
// Once DynamoDB TTL has deleted the item, the next fence is the claiming
// client's clock: larger than the last as long as the clocks of the
// consumers agree within the time since the last claim, which is at least
// the lease or retention that let TTL delete the item plus
// ClockSkewMargin and TTL's own delay (hours to days). See Store.Claim.
//
// # Global tables
//
// New refuses a global table replicated with multi-Region eventual
// consistency (a *ReplicasError, ErrEventuallyConsistentReplicas): there
// each Region decides conditional writes against its own copy, so two
// Regions can both acquire a key. Config.AllowEventuallyConsistentReplicas
// accepts it, for tables that every consumer writes in one Region. A
// global table with multi-Region strong consistency decides every
// conditional write across Regions and is accepted; DynamoDB gives it
// neither TTL (set Config.SkipTTL) nor transactions (RunInTx refuses to
// start: ErrNoTransactions).
//
// # Waiting copies poll
//
// A copy that waits for a held key (dedup.Config.InProgressWait) polls:
// DynamoDB cannot announce a completion short of a Streams consumer, so
// Store has no WatchKey method (it cannot wake waiters). Each poll is one
// conditional PutItem that fails its condition, billed as a write (1 WCU
// up to 1 KB): with the defaults about 5 in the first 0.62 s of a wait,
// then one per second.
//
// # Limits
//
// Keys must be non-empty UTF-8 ([ErrInvalidKey]); long keys are hashed as
// above, so any length works. A result is stored whole or refused with
// [ErrResultTooLarge] when the item would exceed DynamoDB's 400 KB
// (Store.MaxResultSize: 408472 bytes with the default attribute names).
//
// # Sharing a table with Powertools
//
// With Config.Format = FormatPowertools the store reads and writes the
// items of Powertools for AWS Lambda's DynamoDBPersistenceLayer
// (TypeScript and Python), so that functions on either share one table:
//
//	id                      S  "<scope>#<key>" (PowertoolsPartitionKey):
//	                           Powertools' "<prefix>#<hash>"
//	status                  S  "INPROGRESS" | "COMPLETED"
//	expiration              N  epoch seconds: the end of the record's life
//	                           (in progress: the lease's end plus the margin,
//	                           rounded up; completed: the retention's end,
//	                           rounded up); the TTL attribute
//	in_progress_expiration  N  epoch milliseconds: the lease's end plus
//	                           ClockSkewMargin; 0 once released
//	data                       the result, as PowertoolsLayout.Runtime keeps it
//	validation              S  the fingerprint
//
// and the store's own token, fence, result (the bytes, when data cannot
// hold them exactly) and who-and-when, which Powertools ignores. Names
// are configurable as Powertools' (PowertoolsLayout).
//
// A claim is Powertools' conditional PutItem with ClockSkewMargin: a
// record is free when attribute_not_exists(id), or its expiration passed
// the margin ago, or it is INPROGRESS with an in_progress_expiration that
// passed (the margin ago for a record Powertools wrote, at all for one of
// this store, whose in_progress_expiration includes the margin). Each
// side's claim therefore fails while the other's item is live. Complete,
// Extend and Release are conditional on the claim's token, as in the
// native layout; Release sets in_progress_expiration to 0, which
// Powertools reads as an expired claim. Powertools completes and deletes
// without a condition: docs/migrating-from-powertools.md says what the
// mixed fleet guarantees and what it does not.
//
// # The effect and its record in one transaction
//
// A handler whose effect is written to DynamoDB can have it written in the
// same transaction as the completion of its record, and only if its claim
// is still valid: Store.TxMiddleware (Watermill) and Store.RunInTx
// (Engine.Do, Lambda) send the writes the handler added to its Tx
// (TxFromContext, Tx.Add) and the completion in one TransactWriteItems.
// dynalite has no transactions. The guide docs/effect-in-transaction.md
// puts it beside Redis and PostgreSQL.
package dynamo
