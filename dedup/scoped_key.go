package dedup

import "strings"

// ScopedKey returns the record key for a business key within a scope:
// the scope, escaped, then ":" then the business key verbatim.
//
// The scope is escaped ("%" → "%25", ":" → "%3A") so that the first ":" always
// ends it: scope "a:b" with key "c" and scope "a" with key "b:c" give
// "a%3Ab:c" and "a:b:c", never the same record. Handler names rarely contain
// either character, so keys stay readable ("charge-orders:ORDER-003").
func ScopedKey(scope, key string) string {
	return escapeScope(scope) + ":" + key
}

var scopeEscaper = strings.NewReplacer("%", "%25", ":", "%3A")

func escapeScope(scope string) string {
	return scopeEscaper.Replace(scope)
}
