package dedup

import (
	"context"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"time"
)

var _ Admin = (*MemoryStore)(nil)

// Inspect implements [Admin.Inspect]. Created is always zero: the memory
// store does not keep it. Cost: one map lookup under the store's mutex.
func (s *MemoryStore) Inspect(ctx context.Context, key string) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.live(key, now)
	if r == nil {
		return Record{}, fmt.Errorf("%w: %.200q", ErrNotFound, key)
	}
	return r.info(key, r.deadline.Sub(now)), nil
}

func (r *memRecord) info(key string, remaining time.Duration) Record {
	rec := Record{Key: key, State: StateInProgress, Fingerprint: r.fingerprint, ResultSize: len(r.result), Remaining: remaining}
	if r.completed {
		rec.State = StateCompleted
	}
	return rec
}

// Evict implements [Admin.Evict]: it deletes the record whatever its token.
// Cost: one map operation under the store's mutex.
func (s *MemoryStore) Evict(ctx context.Context, key string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live(key, now) == nil {
		return false, nil
	}
	delete(s.records, key)
	return true, nil
}

// List implements [Admin.List] in key order. The cursor is the hex of the
// last key returned. Cost: every call visits and sorts every record under
// the store's mutex, O(n log n): fine for tests and small stores.
func (s *MemoryStore) List(ctx context.Context, prefix, cursor string, limit int) ([]Record, string, error) {
	if err := CheckListLimit(limit); err != nil {
		return nil, "", err
	}
	after := ""
	if cursor != "" {
		b, err := hex.DecodeString(cursor)
		if err != nil || len(b) == 0 || !strings.HasPrefix(string(b), prefix) {
			return nil, "", fmt.Errorf("%w: %.40q", ErrInvalidCursor, cursor)
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
		if strings.HasPrefix(k, prefix) && k > after && now.Before(r.deadline) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	next := ""
	if len(keys) > limit {
		keys = keys[:limit]
		next = hex.EncodeToString([]byte(keys[limit-1]))
	}
	out := make([]Record, len(keys))
	for i, k := range keys {
		r := s.records[k]
		out[i] = r.info(k, r.deadline.Sub(now))
	}
	return out, next, nil
}
