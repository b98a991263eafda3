package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

// claimScript is the Lua alternative to SET NX PX GET that the benchmark
// measured (see README.md): GET, and SET only when absent.
var claimScript = goredis.NewScript(`
local old = redis.call('GET', KEYS[1])
if old then return old end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
`)

// LuaClaimStore is a Store whose Claim runs claimScript instead of SET NX PX
// GET; everything else is the Store's. Tests run the conformance suite on it
// and the benchmark compares the two.
type LuaClaimStore struct{ *Store }

// Claim is Store.Claim with a script.
func (s LuaClaimStore) Claim(ctx context.Context, key, fingerprint string, lease time.Duration) (dedup.ClaimResult, error) {
	if err := storekit.CheckDuration("lease", lease); err != nil {
		return dedup.ClaimResult{}, err
	}
	raw := storekit.RawToken()
	token := string(raw[:])
	fp := fingerprintDigest(fingerprint)
	now := time.Now()
	p := firstClaim(ctx, now)
	fence := storekit.NextFence(0, now)
	old, err := claimScript.Run(ctx, s.client, []string{s.prefix + key}, appendInProgress(nil, &raw, fp, &p, fence), millis(lease)).Text()
	if errors.Is(err, goredis.Nil) {
		return dedup.ClaimResult{Outcome: dedup.Acquired, Claim: dedup.Claim{Key: key, Token: token, Fence: fence}}, nil
	}
	if err != nil {
		return dedup.ClaimResult{}, fmt.Errorf("dedup/redis: claim: %w", err)
	}
	res, err := outcomeOf([]byte(old), raw, fp, key, token)
	if err == errReleased {
		return s.takeOver(ctx, key, []byte(old), raw, fp, token, lease)
	}
	return res, err
}

// ClaimAs is Claim with WaitReplicas, but with a given owner token: what a
// claim meets when go-redis retried its SET on another connection after the
// first attempt had reached the server (the record carries its own token).
func (s *Store) ClaimAs(ctx context.Context, key, token string, lease time.Duration) (dedup.ClaimResult, error) {
	_, raw, err := rawToken("claim", dedup.Claim{Key: key, Token: token})
	if err != nil {
		return dedup.ClaimResult{}, err
	}
	now := time.Now()
	p := firstClaim(ctx, now)
	return s.claimWait(ctx, key, raw, fingerprintDigest(""), &p, storekit.NextFence(0, now), lease)
}

// WithAutoPipeliner returns a copy of s that sends its commands through
// go-redis' auto-pipeliner ap instead of its own batcher, for the
// benchmark that compares the two.
func WithAutoPipeliner(s *Store, ap *goredis.AutoPipeliner) *Store {
	c := *s
	c.batch, c.ap = nil, ap
	return &c
}

// InProgressRecord is the in-progress record a claim with token writes
// for a fingerprint, a provenance and a fence (0: none, a record written
// before fencing).
func InProgressRecord(token [16]byte, fingerprint string, claimedAt int64, claims uint64, origin dedup.Origin, fence uint64) string {
	p := provenance{claimedAt: claimedAt, claims: claims, origin: origin}
	return string(appendInProgress(nil, &token, fingerprintDigest(fingerprint), &p, fence))
}

// AppendCompleted is appendCompleted: the completed record (without its
// result) the client builds from the in-progress record v.
func AppendCompleted(v string, now int64, omitProvenance bool) (string, bool) {
	b, ok := appendCompleted(nil, v, now, omitProvenance)
	return string(b), ok
}

// RunComplete runs the Complete script on the record under key (the
// store's prefix added) for the claim with token, completed at now, with
// built and expected as its ARGV[7] and ARGV[8] (empty: the script builds
// the record), and returns the script's reply.
func (s *Store) RunComplete(ctx context.Context, key string, token [16]byte, result []byte, now int64, built, expected string) (int64, error) {
	if result == nil {
		result = []byte{}
	}
	return completeOp.script.Run(ctx, s.client, []string{s.prefix + key},
		string(token[:]), appendCompact(nil, &token), 60000, result, now, s.omitProvenance, built, expected).Int64()
}

// CaptureCompleteArgs makes the Complete scripts also write the completed
// record the client built and the in-progress record it expected
// (completeSrc's ARGV[7] and ARGV[8], completeAsClaimedSrc's ARGV[2] and
// ARGV[1]) under the record's key with the suffix "#built" and
// "#expected", until the returned function restores them.
func CaptureCompleteArgs() (restore func()) {
	saved, savedAsClaimed := completeOp, completeAsClaimedOp
	completeOp = newOwnedScript(`
redis.call('SET', KEYS[1] .. '#built', ARGV[7] or '')
redis.call('SET', KEYS[1] .. '#expected', ARGV[8] or '')
` + completeSrc)
	completeAsClaimedOp = newOwnedScript(`
redis.call('SET', KEYS[1] .. '#built', ARGV[2])
redis.call('SET', KEYS[1] .. '#expected', ARGV[1])
` + completeAsClaimedSrc)
	return func() { completeOp, completeAsClaimedOp = saved, savedAsClaimed }
}

// HashTagOf is Tx.HashTag for the record whose Redis key (the store's
// prefix included) is recordKey.
func HashTagOf(recordKey string) string { return (&Tx{recordKey: recordKey}).HashTag() }

// KeySlot is the store's own Redis Cluster slot of key.
func KeySlot(key string) int { return keySlot(key) }

// TrickyRecordKeys are Redis keys of records whose prefix, scope or
// business key hold "{" and "}" in every position.
var TrickyRecordKeys = trickyRecordKeys
