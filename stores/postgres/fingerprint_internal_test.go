package postgres

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// Every stored fingerprint fits a text column (valid UTF-8, no NUL), and
// two different fingerprints are never stored alike.
func FuzzStoredFingerprint(f *testing.F) {
	f.Add("fp", "\x01sha256:fp")
	f.Add("\x00", "\x01sha256:6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d")
	f.Add("\xff\xfe", "\ufffd\ufffd")
	f.Add("", "\x00")
	f.Fuzz(func(t *testing.T, a, b string) {
		sa, sb := storedFingerprint(a), storedFingerprint(b)
		for _, s := range []string{sa, sb} {
			if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
				t.Fatalf("stored fingerprint %q does not fit a text column", s)
			}
		}
		if a != b && sa == sb {
			t.Fatalf("fingerprints %q and %q are both stored as %q", a, b, sa)
		}
		if (a == "") != (sa == "") {
			t.Fatalf("fingerprint %q stored as %q: none must stay none", a, sa)
		}
	})
}
