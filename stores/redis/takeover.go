package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

var (
	takeoverScript = goredis.NewScript(takeoverSrc)
	discardScript  = goredis.NewScript(discardSrc)
)

// maxTakeovers bounds the compare-and-set attempts of a claim that keeps
// finding a released record that changed under it (other claims taking it
// over and releasing it again meanwhile); it then reports InProgress.
const maxTakeovers = 4

// takeOver is the rest of a claim that found the released record old
// (see Claim): it writes the claim's in-progress record in its place with
// takeoverScript, keeping the released record's provenance and counting
// one more claim, with a fence larger than old's (takeoverValue). One round trip per attempt (with Config.WaitReplicas,
// the script and WAIT share it).
func (s *Store) takeOver(ctx context.Context, key string, old []byte, raw [tokenLen]byte, fp []byte, token string, lease time.Duration) (dedup.ClaimResult, error) {
	for attempt := 1; ; attempt++ {
		origin, _ := dedup.OriginFromContext(ctx)
		value, fence, err := takeoverValue(old, &raw, fp, origin)
		if err != nil {
			return dedup.ClaimResult{}, err
		}
		reply, err := s.casReleased(ctx, key, old, value, &raw, lease)
		if errors.Is(err, goredis.Nil) {
			return dedup.ClaimResult{Outcome: dedup.Acquired, Claim: dedup.Claim{Key: key, Token: string(value), Fence: fence}}, nil
		}
		if err != nil {
			return dedup.ClaimResult{}, err
		}
		res, err := outcomeOf(reply, raw, fp, key, token)
		if err == nil && res.Outcome == dedup.Acquired {
			// Our own record, written by an earlier attempt of the script:
			// the token is the record as it stands (see Claim.Token).
			res.Claim.Token = string(reply)
		}
		if err == nil && res.Outcome == dedup.Acquired && s.waitReplicas > 0 {
			// Our own record, written by an earlier attempt on another
			// connection: make this one write it again for WAIT.
			if err := s.touch(ctx, "claim", key, &raw); err != nil {
				s.releaseRefused(ctx, key, &raw)
				return dedup.ClaimResult{}, err
			}
		}
		if err != errReleased {
			return res, err
		}
		if attempt == maxTakeovers {
			return dedup.ClaimResult{Outcome: dedup.InProgress}, nil
		}
		old = reply
	}
}

// casReleased runs takeoverScript: goredis.Nil when it wrote value, else
// the value it found.
func (s *Store) casReleased(ctx context.Context, key string, old, value []byte, raw *[tokenLen]byte, lease time.Duration) ([]byte, error) {
	keys := []string{s.prefix + key}
	if s.waitReplicas == 0 {
		v, err := takeoverScript.Run(ctx, s.client, keys, old, value, millis(lease)).Text()
		if err != nil && !errors.Is(err, goredis.Nil) {
			return nil, fmt.Errorf("dedup/redis: claim: %w", err)
		}
		return []byte(v), err
	}
	var cmd *goredis.Cmd
	n, err := s.withWait(ctx, s.prefix+key, takeoverScript, func(p goredis.Pipeliner) goredis.Cmder {
		cmd = takeoverScript.EvalSha(ctx, p, keys, old, value, millis(lease))
		return cmd
	})
	if err != nil {
		if cmd != nil && errors.Is(cmd.Err(), goredis.Nil) {
			s.releaseRefused(ctx, key, raw) // written, but WAIT did not answer
		}
		return nil, fmt.Errorf("dedup/redis: claim: %w", err)
	}
	v, err := cmd.Text()
	switch {
	case errors.Is(err, goredis.Nil):
		if err := s.confirm("claim", key, n); err != nil {
			s.releaseRefused(ctx, key, raw)
			return nil, err
		}
		return nil, goredis.Nil
	case err != nil:
		return nil, fmt.Errorf("dedup/redis: claim: %w", err)
	}
	return []byte(v), nil
}
