package redis

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

var _ admin.Interface = (*Store)(nil)

// inspectScript reads a record and its TTL atomically: KEYS[1] the Redis
// key. It replies nil when the key is absent, else {value, PTTL}.
var inspectScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return false end
return {v, redis.call('PTTL', KEYS[1])}
`)

// List's SCAN tuning. Each List call issues at most maxScanCalls SCANs; the
// COUNT hint starts at the page size, doubles after a reply without a
// matching key (a sparse prefix) up to maxScanCount, and drops back when a
// reply brings more keys than the page has room for.
const (
	maxScanCalls = 64
	maxScanCount = 1000
)

// Inspect implements admin.Interface.Inspect: one script run (GET and PTTL,
// atomically; EVALSHA, plus one EVAL if the server lost its script cache).
// Created is always zero; ClaimedAt and CompletedAt are by the clocks of
// the processes that claimed and completed the record, in milliseconds, and
// zero (as Claims, TransportID and MessageID) for a completed record
// without provenance (Config.OmitProvenance, or written by an earlier
// version). A released record is not found. Fingerprint is the hex of
// the 16-byte digest the record keeps.
// Remaining is the key's TTL on the server's clock. A value that is not a
// record of this format gives an error wrapping ErrUnknownFormat; a key of
// another type, the server's WRONGTYPE error.
func (s *Store) Inspect(ctx context.Context, key string) (admin.Record, error) {
	reply, err := inspectScript.Run(ctx, s.client, []string{s.prefix + key}).Slice()
	if errors.Is(err, goredis.Nil) {
		return admin.Record{}, fmt.Errorf("%w: %.200q", admin.ErrNotFound, key)
	}
	if err != nil {
		return admin.Record{}, fmt.Errorf("dedup/redis: inspect %.200q: %w", key, err)
	}
	rec, err := recordInfo(key, reply)
	if err == errReleased {
		return admin.Record{}, fmt.Errorf("%w: %.200q (released)", admin.ErrNotFound, key)
	}
	if err != nil {
		return admin.Record{}, fmt.Errorf("dedup/redis: inspect %.200q: %w", key, err)
	}
	return rec, nil
}

// recordInfo decodes inspectScript's {value, PTTL} reply.
func recordInfo(key string, reply []any) (admin.Record, error) {
	if len(reply) != 2 {
		return admin.Record{}, fmt.Errorf("unexpected script reply of %d elements", len(reply))
	}
	v, ok1 := reply[0].(string)
	pttl, ok2 := reply[1].(int64)
	if !ok1 || !ok2 {
		return admin.Record{}, fmt.Errorf("unexpected script reply %T, %T", reply[0], reply[1])
	}
	r, err := decodeRecord([]byte(v))
	if err != nil {
		return admin.Record{}, err
	}
	if r.state == stateReleased {
		return admin.Record{}, errReleased
	}
	rec := admin.Record{
		Key:         key,
		State:       admin.StateInProgress,
		Fingerprint: hex.EncodeToString(r.fp),
		ResultSize:  len(r.result),
		Remaining:   time.Duration(pttl) * time.Millisecond,
	}
	if r.state == stateCompleted {
		rec.State = admin.StateCompleted
	}
	if len(r.prov) > 0 {
		p, ok := decodeProvenance(r.prov)
		if !ok {
			rec.Problem = "its provenance field is malformed"
		} else {
			rec.ClaimedAt = time.UnixMilli(p.claimedAt)
			rec.Claims = int(min(p.claims, 1<<31))
			rec.TransportID, rec.MessageID = p.origin.TransportID, p.origin.MessageID
		}
		if d, n := binary.Uvarint(r.completedAfter); ok && n > 0 {
			rec.CompletedAt = rec.ClaimedAt.Add(time.Duration(d) * time.Millisecond)
		}
	}
	if pttl < 0 { // -1: no TTL; the store never writes such a record
		rec.Remaining = 0
		rec.Problem = "the key has no TTL: it never expires (was it PERSISTed?)"
	}
	return rec, nil
}

// evictScript deletes KEYS[1] whatever it holds and replies 1 when it was
// a live record (or a value of another format or type), 0 when there was
// nothing or a released record.
var evictScript = goredis.NewScript(`
local t = redis.call('TYPE', KEYS[1]).ok
if t == 'none' then return 0 end
local live = 1
if t == 'string' then
  local v = redis.call('GET', KEYS[1])
  if string.byte(v, 1) == 2 and string.sub(v, 2, 2) == 'R' then live = 0 end
end
redis.call('DEL', KEYS[1])
return live
`)

// Evict implements admin.Interface.Evict with one script run that deletes
// the record's key whatever its value. Redis holds no expired records, so
// true means a live record (or a value of another format) was deleted; a
// released record is deleted too, and reported as false. One round trip.
func (s *Store) Evict(ctx context.Context, key string) (bool, error) {
	n, err := evictScript.Run(ctx, s.client, []string{s.prefix + key}).Int()
	if err != nil {
		return false, fmt.Errorf("dedup/redis: evict %.200q: %w", key, err)
	}
	return n > 0, nil
}

// listCursor is List's position, sent to the caller as base64url JSON.
type listCursor struct {
	// Prefix is a hash of the listed prefix: a cursor only continues the
	// listing it came from.
	Prefix uint32 `json:"h"`
	// Node is the address of the master whose keyspace is being scanned
	// (Cluster, Ring); "" for a single server.
	Node string `json:"n,omitempty"`
	// Scan is the SCAN cursor on that node; 0 with End false is the
	// node's beginning.
	Scan uint64 `json:"c,omitempty"`
	// End: every node has been scanned; only Pending is left.
	End bool `json:"e,omitempty"`
	// Pending are keys (scoped, without the store's prefix) of the last
	// SCAN reply that did not fit into the page.
	Pending []string `json:"p,omitempty"`
}

func prefixHash(prefix string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(prefix))
	return h.Sum32()
}

func (c listCursor) encode() string {
	b, _ := json.Marshal(c) // cannot fail: strings and numbers only
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s, prefix string) (listCursor, error) {
	var c listCursor
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil {
		return c, fmt.Errorf("%w: %v", admin.ErrInvalidCursor, err)
	}
	if c.Prefix != prefixHash(prefix) {
		return c, fmt.Errorf("%w: it was issued for another prefix", admin.ErrInvalidCursor)
	}
	for _, k := range c.Pending {
		if !strings.HasPrefix(k, prefix) {
			return c, fmt.Errorf("%w: it holds a key outside the prefix", admin.ErrInvalidCursor)
		}
	}
	return c, nil
}

// scanNode is one keyspace to SCAN.
type scanNode struct {
	addr   string
	client goredis.Cmdable
}

// scanNodes returns the keyspaces to scan, in a stable order: every master
// of a Cluster (ForEachMaster) or every live shard of a Ring, sorted by
// address, or the client itself (a single server, Sentinel's master).
func (s *Store) scanNodes(ctx context.Context) ([]scanNode, error) {
	var (
		mu    sync.Mutex
		nodes []scanNode
	)
	collect := func(_ context.Context, c *goredis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		nodes = append(nodes, scanNode{addr: c.Options().Addr, client: c})
		return nil
	}
	switch c := s.client.(type) {
	case *goredis.ClusterClient:
		if err := c.ForEachMaster(ctx, collect); err != nil {
			return nil, err
		}
	case *goredis.Ring:
		if err := c.ForEachShard(ctx, collect); err != nil {
			return nil, err
		}
	default:
		return []scanNode{{client: s.client}}, nil
	}
	if len(nodes) == 0 {
		return nil, errors.New("no master to scan")
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].addr < nodes[j].addr })
	return nodes, nil
}

// globEscaper escapes the characters SCAN MATCH treats specially.
var globEscaper = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)

// List implements admin.Interface.List with SCAN MATCH <prefix>* over the
// keyspace, then reads the page's records (GET and PTTL in one script per
// key, all pipelined: one round trip per page, per master on a Cluster).
//
// Cost: SCAN walks the whole keyspace of the database (every key, not only
// this store's) a batch at a time, O(N) over a full listing; each List call
// issues at most 64 SCANs with a COUNT hint between the page size and 1000,
// so a sparse prefix in a large database gives short or empty pages with a
// cursor. SCAN never blocks the server for long, but every call is a round
// trip. On a Cluster (or Ring) the masters are scanned one after the other,
// in address order; the cursor names the master and the position in its
// SCAN, so a failover or resharding during a listing makes the cursor
// invalid (start again). SCAN may return a key twice; keys that exist
// throughout the listing are returned at least once. Keys left over from
// a SCAN reply that did not fit into the page travel in the cursor. A value
// that is not a record of this format is listed as admin.StateUnreadable.
func (s *Store) List(ctx context.Context, prefix, cursor string, limit int) ([]admin.Record, string, error) {
	if err := storekit.CheckListLimit(limit); err != nil {
		return nil, "", err
	}
	c := listCursor{Prefix: prefixHash(prefix)}
	if cursor != "" {
		var err error
		if c, err = decodeCursor(cursor, prefix); err != nil {
			return nil, "", err
		}
	}
	nodes, err := s.scanNodes(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("dedup/redis: list: %w", err)
	}
	node := 0
	if cursor != "" && !c.End {
		node = slices.IndexFunc(nodes, func(n scanNode) bool { return n.addr == c.Node })
		if node < 0 {
			return nil, "", fmt.Errorf("%w: %q is no longer a master; start the listing again", admin.ErrInvalidCursor, c.Node)
		}
	}
	c.Node = nodes[node].addr

	match := globEscaper.Replace(s.prefix+prefix) + "*"
	keys := make([]string, 0, limit)
	count := int64(limit)
	for calls := 0; ; {
		if len(c.Pending) > 0 {
			n := min(limit-len(keys), len(c.Pending))
			keys = append(keys, c.Pending[:n]...)
			c.Pending = c.Pending[n:]
			if len(keys) == limit {
				break
			}
		}
		if c.End || calls == maxScanCalls {
			break
		}
		need := int64(limit - len(keys))
		batch, next, err := nodes[node].client.Scan(ctx, c.Scan, match, count).Result()
		calls++
		if err != nil {
			return nil, "", fmt.Errorf("dedup/redis: list: SCAN %s: %w", nodes[node].addr, err)
		}
		if int64(len(batch)) > need && count > need && calls < maxScanCalls {
			// More than the page can take: ask again from the same
			// position for fewer buckets, rather than carry many keys in
			// the cursor. SCAN cursors are stateless, so nothing is lost.
			count = need
			continue
		}
		switch {
		case len(batch) == 0:
			count = min(2*count, maxScanCount)
		case count > int64(limit):
			count = int64(limit)
		}
		for _, k := range batch {
			c.Pending = append(c.Pending, strings.TrimPrefix(k, s.prefix))
		}
		c.Scan = next
		if next == 0 {
			if node+1 < len(nodes) {
				node++
				c.Node = nodes[node].addr
			} else {
				c.End = true
			}
		}
	}

	records, err := s.readRecords(ctx, keys)
	if err != nil {
		return nil, "", err
	}
	if c.End && len(c.Pending) == 0 {
		return records, "", nil
	}
	return records, c.encode(), nil
}

// readRecords reads the records of keys with one pipelined script per key
// (one round trip; per master on a Cluster). Keys deleted since they were
// scanned are left out.
func (s *Store) readRecords(ctx context.Context, keys []string) ([]admin.Record, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	pipe := s.client.Pipeline()
	cmds := make([]*goredis.Cmd, len(keys))
	for i, k := range keys {
		cmds[i] = inspectScript.Eval(ctx, pipe, []string{s.prefix + k})
	}
	_, _ = pipe.Exec(ctx) // errors are per command, below
	records := make([]admin.Record, 0, len(keys))
	for i, cmd := range cmds {
		reply, err := cmd.Slice()
		var redisErr goredis.Error
		switch {
		case errors.Is(err, goredis.Nil):
			continue // gone since the SCAN
		case errors.As(err, &redisErr): // e.g. WRONGTYPE: a key of another type under the prefix
			records = append(records, admin.Record{Key: keys[i], State: admin.StateUnreadable, Problem: err.Error()})
			continue
		case err != nil:
			return nil, fmt.Errorf("dedup/redis: list: reading %.200q: %w", keys[i], err)
		}
		rec, err := recordInfo(keys[i], reply)
		if err == errReleased {
			continue
		}
		if err != nil {
			rec = admin.Record{Key: keys[i], State: admin.StateUnreadable, Problem: err.Error()}
		}
		records = append(records, rec)
	}
	return records, nil
}
