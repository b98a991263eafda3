package keys_test

import (
	"strings"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/internal/keys"
)

// TestProblem: a business key is accepted; a blank one, one with a control
// character, one not UTF-8 and one too long are refused.
func TestProblem(t *testing.T) {
	if p := keys.Problem("ORDER-003", keys.DefaultMaxLength); p != "" {
		t.Errorf(`Problem("ORDER-003") = %q, want ""`, p)
	}
	if p := keys.Problem(strings.Repeat("a", keys.DefaultMaxLength), keys.DefaultMaxLength); p != "" {
		t.Errorf("Problem(a key of exactly the maximum length) = %q, want \"\"", p)
	}
	for _, key := range []string{"", " ", "ORDER\n003", "ORDER\x00003", "\xff", strings.Repeat("a", keys.DefaultMaxLength+1)} {
		if p := keys.Problem(key, keys.DefaultMaxLength); p == "" {
			t.Errorf("Problem(%q) = \"\", want a reason", key)
		}
	}
}
