package redis_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// Prefix "app:" with scope "billing" and key "charge:ORDER-1" would be the
// Redis key of prefix "app:billing:" with scope "charge" and key "ORDER-1":
// two stores sharing a database would share the record. The nested prefix
// is refused at construction, so they never do.
func TestNestedPrefixesNeverShareARecord(t *testing.T) {
	ctx := context.Background()
	client := newClient(t)
	run := fmt.Sprint(time.Now().UnixNano())
	outer := newStore(t, client, redis.Config{KeyPrefix: "app" + run + ":"})
	a := admin.ScopedKey("billing", "charge:ORDER-1")
	if res, err := outer.Claim(ctx, a, "", time.Minute); err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("claim %q under %q: %v %v", a, "app:", res.Outcome, err)
	}

	inner, err := redis.New(ctx, redis.Config{Client: client, KeyPrefix: "app" + run + ":billing:"})
	if errors.Is(err, redis.ErrAmbiguousPrefix) {
		return // refused: the two can never meet
	}
	if err != nil {
		t.Fatalf("New with the nested prefix: %v, want nil or ErrAmbiguousPrefix", err)
	}
	b := admin.ScopedKey("charge", "ORDER-1")
	res, err := inner.Claim(ctx, b, "", time.Minute)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("claim of scope %q key %q under the nested prefix: %v %v, want acquired: "+
			"it shares the Redis key %q with scope %q key %q under the outer prefix",
			"charge", "ORDER-1", res.Outcome, err, inner.RedisKey(b), "billing", "charge:ORDER-1")
	}
}

func TestPrefixRule(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		ok     bool
	}{
		{"", true}, // the default, "dedup:"
		{"dedup:", true},
		{":", true},
		{"billing/dedup:", true},
		{"{dedup}:", true}, // a Cluster hash tag is the caller's choice (see KeyPrefix)
		{"dedup-lua:", true},
		{"a*b?[c]%25 🚀:", true},
		{"app:billing:", false},
		{"app:billing", false},
		{"dedup", false}, // "dedup" + "x:k" = "dedupx" + ":k"
		{"dedup-", false},
		{"::", false},
		{"a:b:c:", false},
	} {
		err := redis.Config{Client: anyClient, KeyPrefix: tc.prefix}.Validate()
		if tc.ok && err != nil {
			t.Errorf("prefix %q refused: %v", tc.prefix, err)
		}
		if !tc.ok && !errors.Is(err, redis.ErrAmbiguousPrefix) {
			t.Errorf("prefix %q: got %v, want ErrAmbiguousPrefix", tc.prefix, err)
		}
		_, err = redis.New(context.Background(), redis.Config{Client: newClient(t), KeyPrefix: tc.prefix})
		if tc.ok && err != nil {
			t.Errorf("New with prefix %q: %v", tc.prefix, err)
		}
		if !tc.ok && !errors.Is(err, redis.ErrAmbiguousPrefix) {
			t.Errorf("New with prefix %q: got %v, want ErrAmbiguousPrefix", tc.prefix, err)
		}
	}
}

// Any two prefixes Validate accepts, with any scopes and keys, give the same
// Redis key (prefix + dedup.ScopedKey) only for the same prefix, scope and
// key.
func FuzzPrefixScopeKeyInjective(f *testing.F) {
	f.Add("app:", "billing", "charge:ORDER-1", "app:billing:", "charge", "ORDER-1")
	f.Add("dedup", "x", "k", "dedupx", "", "k")
	f.Add("a:", "b%3A", "c", "a:", "b:", "c")
	f.Add("dedup:", "a:b", "c", "dedup:", "a", "b:c")
	f.Add("p:", "", ":", "p::", "", "")
	f.Fuzz(func(t *testing.T, p1, s1, k1, p2, s2, k2 string) {
		if (redis.Config{Client: anyClient, KeyPrefix: p1}).Validate() != nil || (redis.Config{Client: anyClient, KeyPrefix: p2}).Validate() != nil {
			return
		}
		if p1 == "" {
			p1 = redis.DefaultKeyPrefix
		}
		if p2 == "" {
			p2 = redis.DefaultKeyPrefix
		}
		if p1+admin.ScopedKey(s1, k1) == p2+admin.ScopedKey(s2, k2) && (p1 != p2 || s1 != s2 || k1 != k2) {
			t.Fatalf("(%q, %q, %q) and (%q, %q, %q) share the Redis key %q", p1, s1, k1, p2, s2, k2, p1+admin.ScopedKey(s1, k1))
		}
	})
}
