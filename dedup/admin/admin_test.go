package admin_test

import (
	"strings"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
)

func TestScopePrefix(t *testing.T) {
	for _, tc := range []struct {
		scope, key string
	}{
		{"charge-orders", "ORDER-003"},
		{"a:b", "c"},
		{"50%", "x:y"},
		{"", "k"},
	} {
		p := admin.ScopePrefix(tc.scope)
		if got := admin.ScopedKey(tc.scope, tc.key); !strings.HasPrefix(got, p) {
			t.Errorf("ScopedKey(%q, %q) = %q does not start with ScopePrefix = %q", tc.scope, tc.key, got, p)
		}
	}
	// The keys of scope "a:b" do not start with the prefix of scope "a".
	if k := admin.ScopedKey("a:b", "c"); strings.HasPrefix(k, admin.ScopePrefix("a")) {
		t.Errorf("%q starts with the prefix of scope a, %q", k, admin.ScopePrefix("a"))
	}
	if got := admin.ScopePrefix("charge-orders"); got != "charge-orders:" {
		t.Errorf("ScopePrefix(charge-orders) = %q", got)
	}
}
