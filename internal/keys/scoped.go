// Package keys holds the engine's rules for keys, each stated once: which
// business keys it accepts (Problem) and how a record is named from a
// scope and a business key (Scoped, Split). dedup's engine writes records
// under these names, dedup/admin exposes them to operators, and
// producerkey checks a key it stamps with the same rule.
package keys

import "strings"

// Scoped returns the record key for a business key within a scope.
//
// The scope is escaped ("%" → "%25", ":" → "%3A") so that the first ":" always
// ends it: scope "a:b" with key "c" and scope "a" with key "b:c" give
// "a%3Ab:c" and "a:b:c", never the same record. Handler names rarely contain
// either character, so keys stay readable ("charge-orders:ORDER-003").
func Scoped(scope, key string) string {
	return escaper.Replace(scope) + ":" + key
}

var escaper = strings.NewReplacer("%", "%25", ":", "%3A")

// Split returns the scope (unescaped) and the business key of a record key
// made by Of. A record key without ":" (not made by Scoped) has an empty scope
// and is its own business key.
func Split(record string) (scope, key string) {
	escaped, key, ok := strings.Cut(record, ":")
	switch {
	case !ok:
		return "", record
	case strings.IndexByte(escaped, '%') < 0: // nothing to unescape: no allocation
		return escaped, key
	}
	return unescaper.Replace(escaped), key
}

var unescaper = strings.NewReplacer("%3A", ":", "%25", "%")
