package memory

import (
	"context"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

var _ admin.Interface = (*Store)(nil)

// Inspect implements [admin.Interface.Inspect]. Created is always zero: the memory
// store does not keep it; ClaimedAt and CompletedAt are by the store's
// Clock; ResponseStatus is the one Complete found in its context
// (dedup.RecordDetails). Cost: one map lookup under the store's mutex.
func (s *Store) Inspect(ctx context.Context, key string) (admin.Record, error) {
	if err := ctx.Err(); err != nil {
		return admin.Record{}, err
	}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.live(key, now)
	if r == nil {
		return admin.Record{}, fmt.Errorf("%w: %.200q", admin.ErrNotFound, key)
	}
	return r.info(key, r.deadline.Sub(now)), nil
}

func (r *memRecord) info(key string, remaining time.Duration) admin.Record {
	rec := admin.Record{Key: key, State: admin.StateInProgress, Fingerprint: r.fingerprint, ResultSize: len(r.result), Remaining: remaining,
		ClaimedAt: r.claimedAt, CompletedAt: r.completedAt, TransportID: r.origin.TransportID, MessageID: r.origin.MessageID, Claims: r.claims,
		ResponseStatus: int(r.status)}
	if r.completed {
		rec.State = admin.StateCompleted
	}
	return rec
}

// Evict implements [admin.Interface.Evict]: it deletes the record whatever its token,
// and wakes the key's watches (WatchKey). Cost: one map operation under the
// store's mutex.
func (s *Store) Evict(ctx context.Context, key string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	live := s.live(key, now) != nil
	delete(s.records, key) // a released or expired leftover too
	s.wake(key)
	return live, nil
}

// List implements [admin.Interface.List] in key order. The cursor is the hex of the
// last key returned. Cost: every call visits and sorts every record under
// the store's mutex, O(n log n): fine for tests and small stores.
func (s *Store) List(ctx context.Context, prefix, cursor string, limit int) ([]admin.Record, string, error) {
	return s.list(ctx, prefix, cursor, limit, false)
}

var _ admin.AbandonedLister = (*Store)(nil)

// ListWithAbandoned implements [admin.AbandonedLister]: List, plus the
// in-progress records whose lease has ended (neither released nor taken
// over), until a claim of the key or the store's sweep removes them. Cost
// as List.
func (s *Store) ListWithAbandoned(ctx context.Context, prefix, cursor string, limit int) ([]admin.Record, string, error) {
	return s.list(ctx, prefix, cursor, limit, true)
}

// abandoned reports whether r is an in-progress record whose lease has
// ended at now, neither released nor taken over.
func (r *memRecord) abandoned(now time.Time) bool {
	return !r.completed && !r.released && !now.Before(r.deadline)
}

func (s *Store) list(ctx context.Context, prefix, cursor string, limit int, withAbandoned bool) ([]admin.Record, string, error) {
	if err := storekit.CheckListLimit(limit); err != nil {
		return nil, "", err
	}
	after := ""
	if cursor != "" {
		b, err := hex.DecodeString(cursor)
		if err != nil || len(b) == 0 || !strings.HasPrefix(string(b), prefix) {
			return nil, "", fmt.Errorf("%w: %.40q", admin.ErrInvalidCursor, cursor)
		}
		after = string(b)
	}
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.records))
	for k, r := range s.records {
		if strings.HasPrefix(k, prefix) && k > after && (r.isLive(now) || withAbandoned && r.abandoned(now)) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	next := ""
	if len(keys) > limit {
		keys = keys[:limit]
		next = hex.EncodeToString([]byte(keys[limit-1]))
	}
	out := make([]admin.Record, len(keys))
	for i, k := range keys {
		r := s.records[k]
		out[i] = r.info(k, r.deadline.Sub(now))
	}
	return out, next, nil
}
