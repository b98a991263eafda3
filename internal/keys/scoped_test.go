package keys_test

import (
	"testing"

	"github.com/watermill-dedup/watermill-dedup/internal/keys"
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
		scope, key := keys.Split(keys.Scoped(c.scope, c.key))
		if scope != c.scope || key != c.key {
			t.Errorf("Split(Of(%q, %q)) = %q, %q", c.scope, c.key, scope, key)
		}
	}
	if scope, key := keys.Split("no-colon"); scope != "" || key != "no-colon" {
		t.Errorf("Split(no-colon) = %q, %q", scope, key)
	}
}
