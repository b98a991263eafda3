// Package postgres is a dedup.Store in a PostgreSQL table (pgx v5) that
// commits a handler's business writes and the completion of its key in one
// transaction: TxMiddleware for Watermill handlers, RunInTx for httpdedup
// (Config.InTransaction) and any dedup.Engine.Do work. Subpackage outbox
// adds the handler's outgoing messages to that transaction.
//
// Schema: one table (default "dedup_keys", see Config.Table and
// Store.SchemaSQL) with one row per scoped key. The primary key is the
// SHA-256 of the key, so keys of any length fit the btree; the key itself is
// kept verbatim, and readable columns (scope, business_key, state,
// response_status, created_at, completed_at) let an operator query it in
// plain SQL. Migrate creates it, and upgrades a table of an earlier version
// in place with additive steps.
//
// Claim is one statement (a CTE): INSERT … ON CONFLICT (key_hash) DO
// NOTHING creates the record, an UPDATE guarded by "expired" takes over an
// expired one, and otherwise the live record is read and returned. The
// unique index, not a prior read, arbitrates concurrent claims, and a claim
// of a live key writes nothing: no lock, no row version, no WAL flush. Only
// a claim that loses a race against a concurrent first claim or takeover of
// the same key (committed while its statement ran, so invisible to its
// snapshot) gets no row back; it then runs a second statement, an INSERT …
// ON CONFLICT DO UPDATE that always locks the row and returns it. Both
// give a claim that acquires the key its fence (dedup.Claim.Fence), from
// the clock reading of its lease, and keep it in the fence column (see
// Store.Claim for what the fence's order rests on). Complete, Release and
// Extend are single statements conditioned on the owner token.
//
// Time: every expiry is decided with the server's clock_timestamp(), the
// actual time when the expression is evaluated. now() (and
// statement_timestamp()) would be the start of the transaction (of the
// statement): inside TxMiddleware's transaction, which began before the
// handler ran, now() would judge the lease as it was minutes earlier, and a
// statement that waited for a row lock would judge it as it was before the
// wait. Claim reads the clock once per statement, before any lock wait; a
// stale reading there can only make it report a just-expired record as
// still live, never take over a live one.
//
// Guarantees, from strongest to weakest:
//
//   - With TxMiddleware or RunInTx, the effect (the handler's writes in the
//     same database) and its record (with the stored HTTP response, and
//     with the outbox the outgoing messages) commit together or not at all:
//     no window between effect and record, whatever crashes when.
//   - Without it, the store gives the dedup middleware's guarantee for any
//     effect: the record is completed after the handler returns; a crash
//     between the two leaves the record in progress until its lease ends,
//     after which a redelivery runs the effect again.
//
// Expired records are taken over in place by the next claim; DeleteExpired
// only bounds the table's size, and correctness never depends on it.
package postgres
