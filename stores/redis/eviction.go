package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// noEviction is the only maxmemory-policy under which Redis never deletes a
// key before its TTL: a full server refuses writes (OOM) instead.
const noEviction = "noeviction"

// ErrEvictionPolicy: New found a server whose maxmemory-policy is not
// noeviction, so that a full server deletes keys to make room. The
// allkeys-* policies delete any key, the volatile-* ones exactly the keys
// with a TTL, which every record has. An evicted completed record lets the
// next copy of its message run the effect again, an evicted in-progress one
// lets a copy run concurrently with its owner. The error is an
// *EvictionPolicyError. Set maxmemory-policy noeviction, or
// Config.AllowEviction to accept the risk.
var ErrEvictionPolicy = errors.New("dedup/redis: the server evicts keys when full (maxmemory-policy is not noeviction)")

// EvictionPolicyError is returned by New for a server whose maxmemory-policy
// is not noeviction. It matches ErrEvictionPolicy.
type EvictionPolicyError struct {
	// Addr is the server's address as the client knows it.
	Addr string
	// Policy is its maxmemory-policy, e.g. "allkeys-lru".
	Policy string
}

func (e *EvictionPolicyError) Error() string {
	return fmt.Sprintf("dedup/redis: %s has maxmemory-policy %s: when memory is full it deletes records, "+
		"and the next copy of a message whose record was deleted runs its effect again; "+
		"set maxmemory-policy noeviction (on managed Redis: in the parameter group or instance configuration), "+
		"or set Config.AllowEviction to accept this", e.Addr, e.Policy)
}

// Unwrap returns ErrEvictionPolicy.
func (e *EvictionPolicyError) Unwrap() error { return ErrEvictionPolicy }

// errPolicyUnreadable: the server answered, but with neither INFO memory's
// maxmemory_policy nor CONFIG GET (a server that renames or forbids both).
var errPolicyUnreadable = errors.New("dedup/redis: the server does not tell its maxmemory-policy")

// evictionPolicy reads a server's maxmemory-policy: from INFO memory, which
// managed services (ElastiCache, MemoryStore) answer although they refuse
// CONFIG, else from CONFIG GET. One round trip, two when INFO memory does
// not carry the field. When the server refuses both (a Redis error reply, or
// no such field), the error wraps errPolicyUnreadable; a network error is
// returned as it is.
func evictionPolicy(ctx context.Context, c goredis.Cmdable) (string, error) {
	info, infoErr := c.Info(ctx, "memory").Result()
	if infoErr == nil {
		if p := infoField(info, "maxmemory_policy"); p != "" {
			return p, nil
		}
		infoErr = errors.New("INFO memory has no maxmemory_policy field")
	} else if !isServerError(infoErr) {
		return "", infoErr
	}
	conf, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err == nil {
		if p := conf["maxmemory-policy"]; p != "" {
			return p, nil
		}
		err = errors.New("CONFIG GET maxmemory-policy returned nothing")
	} else if !isServerError(err) {
		return "", err
	}
	return "", fmt.Errorf("%w (INFO memory: %v; CONFIG GET: %v)", errPolicyUnreadable, infoErr, err)
}

// isServerError tells a Redis error reply (NOPERM, an unknown command) from
// a failure to talk to the server.
func isServerError(err error) bool {
	var rerr goredis.Error
	return errors.As(err, &rerr) && !errors.Is(err, goredis.Nil)
}

// infoField returns the value of field in an INFO reply, or "".
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}
