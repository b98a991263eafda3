package keys

// The rule for business keys: valid UTF-8 without control characters, not
// blank, at most dedup.Config.MaxKeyLength bytes (1024 by default). Package
// dedup refuses a key that breaks it with a *dedup.KeyError (ErrNoKey);
// package producerkey checks a key it stamps with it, so that a message its
// consumers would refuse for good is refused at publish time instead,
// while it can still be fixed.

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// DefaultMaxLength is dedup.Config.MaxKeyLength's default, in bytes.
const DefaultMaxLength = 1024

// Problem returns why key cannot be a business key of an engine whose
// MaxKeyLength is maxLength (empty or blank, not UTF-8, a control
// character, too long), or "" when it can. Cost: one pass over the key.
func Problem(key string, maxLength int) string {
	switch {
	case strings.TrimFunc(key, unicode.IsSpace) == "":
		return "empty or blank key"
	case !utf8.ValidString(key):
		return "key is not valid UTF-8"
	case strings.IndexFunc(key, unicode.IsControl) >= 0:
		return "key contains a control character (NUL, newline, ...)"
	case len(key) > maxLength:
		return fmt.Sprintf("key is %d bytes, longer than MaxKeyLength %d", len(key), maxLength)
	}
	return ""
}
