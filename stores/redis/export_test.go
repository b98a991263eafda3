package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/storekit"
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
	p := firstClaim(ctx)
	old, err := claimScript.Run(ctx, s.client, []string{s.prefix + key}, appendInProgress(nil, &raw, fp, &p), millis(lease)).Text()
	if errors.Is(err, goredis.Nil) {
		return dedup.ClaimResult{Outcome: dedup.Acquired, Claim: dedup.Claim{Key: key, Token: token}}, nil
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
	var raw [tokenLen]byte
	if len(token) != tokenLen {
		return dedup.ClaimResult{}, fmt.Errorf("token of %d bytes", len(token))
	}
	copy(raw[:], token)
	p := firstClaim(ctx)
	return s.claimWait(ctx, key, raw, fingerprintDigest(""), &p, token, lease)
}

// WithAutoPipeliner returns a copy of s that sends its commands through
// go-redis' auto-pipeliner ap instead of its own batcher, for the
// benchmark that compares the two.
func WithAutoPipeliner(s *Store, ap *goredis.AutoPipeliner) *Store {
	c := *s
	c.batch, c.ap = nil, ap
	return &c
}
