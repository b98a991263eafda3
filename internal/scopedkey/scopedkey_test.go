package scopedkey_test

import (
	"testing"

	"github.com/watermill-dedup/watermill-dedup/internal/scopedkey"
)

func TestSplitInvertsOf(t *testing.T) {
	for _, c := range []struct{ scope, key string }{
		{"charge-orders", "ORDER-003"},
		{"a:b", "c"},
		{"a", "b:c"},
		{"100% %3A", "%25:x"},
		{"", "k"},
		{"acct_42 POST /payments", ""},
	} {
		scope, key := scopedkey.Split(scopedkey.Of(c.scope, c.key))
		if scope != c.scope || key != c.key {
			t.Errorf("Split(Of(%q, %q)) = %q, %q", c.scope, c.key, scope, key)
		}
	}
	if scope, key := scopedkey.Split("no-colon"); scope != "" || key != "no-colon" {
		t.Errorf("Split(no-colon) = %q, %q", scope, key)
	}
}
