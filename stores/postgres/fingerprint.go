package postgres

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"
)

// digestFingerprintPrefix starts the stored form of a fingerprint that a
// text column cannot hold verbatim. U+0001 is valid text, and no verbatim
// fingerprint starts with it (such a fingerprint is digested too), so the
// two forms never collide.
const digestFingerprintPrefix = "\x01sha256:"

// storedFingerprint returns the fingerprint column's value for fingerprint.
// A fingerprint is any string of bytes (a raw digest has NUL bytes and
// invalid UTF-8, which PostgreSQL refuses in text: SQLSTATE 22021), and the
// store only compares fingerprints for equality. So:
//
//   - "" (no fingerprint) stays "";
//   - valid UTF-8 without NUL that does not start with U+0001 is kept
//     verbatim, exactly as earlier versions stored it, so their rows still
//     compare equal during a rolling upgrade;
//   - anything else becomes "\x01sha256:" + the hex of its SHA-256 (72
//     bytes), equal for equal fingerprints and, up to SHA-256 collisions,
//     different for different ones.
//
// The mapping is injective (up to SHA-256 collisions): verbatim values never
// start with U+0001 and digested ones always do.
func storedFingerprint(fingerprint string) string {
	if fingerprint == "" ||
		utf8.ValidString(fingerprint) && !strings.ContainsRune(fingerprint, 0) && !strings.HasPrefix(fingerprint, "\x01") {
		return fingerprint
	}
	sum := sha256.Sum256([]byte(fingerprint))
	return digestFingerprintPrefix + hex.EncodeToString(sum[:])
}
