package postgres

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

var _ admin.Interface = (*Store)(nil)

// inspectSQL reads a live record by its primary key. Remaining is computed
// on the server's clock, in microseconds.
const inspectSQL = `
SELECT r.state, r.fingerprint, coalesce(octet_length(r.result), 0)::bigint, r.created_at,
       (extract(epoch FROM r.expires_at - n.at) * 1000000)::bigint,
       r.claimed_at, r.completed_at, coalesce(r.transport_id, ''), coalesce(r.message_id, ''), coalesce(r.claims, 0),
       coalesce(r.response_status, 0)::int
FROM {table} AS r, (SELECT clock_timestamp() AS at) AS n
WHERE r.key_hash = $1 AND r.expires_at > n.at`

// evictSQL deletes a record whatever its token and state, and says whether
// it was live.
const evictSQL = `
DELETE FROM {table} WHERE key_hash = $1 RETURNING expires_at > clock_timestamp()`

// listSQL returns one page of live records whose key starts with a prefix
// ($1, a LIKE pattern), after the key $2, in byte order (COLLATE "C"), at
// most $3 of them, as parallel arrays in one row (the DB interface has
// QueryRow, not Query). The key conditions are written on key COLLATE "C"
// so that an index on (key COLLATE "C"), if the operator creates one, turns
// the sequential scan into an index range scan.
const listSQL = `
WITH n AS MATERIALIZED (SELECT clock_timestamp() AS at),
page AS (
  SELECT r.key COLLATE "C" AS key, r.state, r.fingerprint, coalesce(octet_length(r.result), 0)::bigint AS size,
         r.created_at, (extract(epoch FROM r.expires_at - n.at) * 1000000)::bigint AS remaining,
         r.claimed_at, r.completed_at, coalesce(r.transport_id, '') AS transport_id,
         coalesce(r.message_id, '') AS message_id, coalesce(r.claims, 0) AS claims,
         coalesce(r.response_status, 0)::int AS response_status
  FROM {table} AS r, n
  WHERE r.key COLLATE "C" LIKE $1 AND r.key COLLATE "C" > $2 AND r.expires_at > n.at
  ORDER BY r.key COLLATE "C"
  LIMIT $3
)
SELECT coalesce(array_agg(key ORDER BY key), '{}'), coalesce(array_agg(state ORDER BY key), '{}'),
       coalesce(array_agg(fingerprint ORDER BY key), '{}'), coalesce(array_agg(size ORDER BY key), '{}'),
       coalesce(array_agg(created_at ORDER BY key), '{}'), coalesce(array_agg(remaining ORDER BY key), '{}'),
       coalesce(array_agg(claimed_at ORDER BY key), '{}'), coalesce(array_agg(completed_at ORDER BY key), '{}'),
       coalesce(array_agg(transport_id ORDER BY key), '{}'), coalesce(array_agg(message_id ORDER BY key), '{}'),
       coalesce(array_agg(claims ORDER BY key), '{}'), coalesce(array_agg(response_status ORDER BY key), '{}')
FROM page`

func (s *Store) adminSQL(q string) string { return strings.ReplaceAll(q, "{table}", s.table) }

// likeEscaper escapes LIKE's wildcards and its escape character.
var likeEscaper = strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)

// provenance is a row's who-and-when columns (NULL times are nil), and
// its response_status (0 for NULL).
type provenance struct {
	claimedAt, completedAt *time.Time
	transportID, messageID string
	claims                 int32
	responseStatus         int32
}

func recordOf(key, state, fingerprint string, size int64, created time.Time, remainingMicros int64, p provenance) admin.Record {
	r := admin.Record{
		Key:            key,
		State:          state,
		Fingerprint:    fingerprint,
		ResultSize:     int(size),
		Created:        created,
		Remaining:      time.Duration(remainingMicros) * time.Microsecond,
		TransportID:    p.transportID,
		MessageID:      p.messageID,
		Claims:         int(p.claims),
		ResponseStatus: int(p.responseStatus),
	}
	if p.claimedAt != nil {
		r.ClaimedAt = *p.claimedAt
		if p.completedAt != nil {
			r.CompletedAt = *p.completedAt
		}
	}
	if state != stateInProgress && state != stateCompleted {
		r.State = admin.StateUnreadable
		r.Problem = fmt.Sprintf("unknown state %q", state)
	}
	return r
}

// Inspect implements admin.Interface.Inspect: one SELECT by primary key (the
// key's SHA-256), one round trip. A row past its lease or retention (not
// yet deleted by DeleteExpired) counts as absent, on the server's clock.
// Created is the created_at column: when the claim that created or took
// over the record ran, on the server's clock; ClaimedAt (claimed_at) is
// when its first claim ran, kept across releases and takeovers;
// ResponseStatus is the response_status column.
// A released record (its lease ended at the release) is not found. Fingerprint is the column:
// verbatim, or "\x01sha256:<hex>" for a fingerprint text cannot hold.
func (s *Store) Inspect(ctx context.Context, key string) (admin.Record, error) {
	var (
		state, fingerprint string
		size, remaining    int64
		created            time.Time
		p                  provenance
	)
	err := s.db.QueryRow(ctx, s.adminSQL(inspectSQL), keyHash(key)).Scan(&state, &fingerprint, &size, &created, &remaining,
		&p.claimedAt, &p.completedAt, &p.transportID, &p.messageID, &p.claims, &p.responseStatus)
	if errors.Is(err, pgx.ErrNoRows) {
		return admin.Record{}, fmt.Errorf("%w: %.200q", admin.ErrNotFound, key)
	}
	if err != nil {
		return admin.Record{}, fmt.Errorf("postgres: inspect: %w", err)
	}
	rec := recordOf(key, state, fingerprint, size, created, remaining, p)
	if rec.State == admin.StateUnreadable {
		return admin.Record{}, fmt.Errorf("postgres: inspect %.200q: %s", key, rec.Problem)
	}
	return rec, nil
}

// Evict implements admin.Interface.Evict: one DELETE by primary key whatever
// the token and state, one round trip. It reports whether the deleted row
// was live; an expired row is deleted too, and reported as false.
func (s *Store) Evict(ctx context.Context, key string) (bool, error) {
	var live bool
	err := s.db.QueryRow(ctx, s.adminSQL(evictSQL), keyHash(key)).Scan(&live)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("postgres: evict: %w", err)
	}
	return live, nil
}

// List implements admin.Interface.List: one SELECT per page (one round trip),
// in byte order of the key, with keyset pagination (the cursor is the last
// key returned, base64url-encoded), so pages are stable under concurrent
// writes: no record is listed twice. Rows past their lease or retention
// are skipped.
//
// Cost: the table has no index on key (Migrate creates the primary key on
// key_hash, an index on expires_at and a hash index on business_key, which
// serves equality only), so every page reads every live
// row (a sequential scan, or the expires_at index), filters it by prefix and
// sorts the matches: O(table) per page, whatever the prefix and limit, and
// O(table × pages) for a full listing. If you list often on a large table,
// create an index yourself, e.g.
//
//	CREATE INDEX CONCURRENTLY dedup_keys_key_c_idx ON dedup_keys (key COLLATE "C");
//
// which turns each page into an index range scan over the prefix's rows
// (TestAdminListPlan checks both plans). Every claim then writes one more
// index entry holding the whole key, and a key that does not compress below
// a btree entry's limit (2704 bytes, scope included) makes its claim fail
// ("index row size exceeds btree version 4 maximum"). Migrate does not
// create it.
func (s *Store) List(ctx context.Context, prefix, cursor string, limit int) ([]admin.Record, string, error) {
	if err := storekit.CheckListLimit(limit); err != nil {
		return nil, "", err
	}
	after := ""
	if cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(cursor)
		if err != nil || len(b) == 0 || !strings.HasPrefix(string(b), prefix) {
			return nil, "", fmt.Errorf("%w: %.40q", admin.ErrInvalidCursor, cursor)
		}
		after = string(b)
	}
	var (
		keys, states, fingerprints []string
		sizes, remaining           []int64
		created                    []time.Time
		claimedAt, completedAt     []*time.Time
		transportIDs, messageIDs   []string
		claims, responseStatuses   []int32
	)
	err := s.db.QueryRow(ctx, s.adminSQL(listSQL), likeEscaper.Replace(prefix)+"%", after, limit+1).
		Scan(&keys, &states, &fingerprints, &sizes, &created, &remaining, &claimedAt, &completedAt, &transportIDs, &messageIDs, &claims, &responseStatuses)
	if err != nil {
		return nil, "", fmt.Errorf("postgres: list: %w", err)
	}
	n := min(len(keys), limit)
	records := make([]admin.Record, n)
	for i := range n {
		records[i] = recordOf(keys[i], states[i], fingerprints[i], sizes[i], created[i], remaining[i],
			provenance{claimedAt[i], completedAt[i], transportIDs[i], messageIDs[i], claims[i], responseStatuses[i]})
	}
	next := ""
	if len(keys) > limit { // one more row exists beyond this page
		next = base64.RawURLEncoding.EncodeToString([]byte(keys[limit-1]))
	}
	return records, next, nil
}
