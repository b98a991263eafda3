package dynamo

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"unicode/utf8"
)

const (
	// MaxVerbatimKeyBytes is the longest key (in UTF-8 bytes) stored as-is
	// in the partition key. DynamoDB allows 2048 bytes; longer keys are
	// hashed (see PartitionKey). Part of the storage format: changing it
	// would give some keys a different partition key.
	MaxVerbatimKeyBytes = 512

	// hashedKeyMarker separates the readable prefix of a long key from its
	// digest.
	hashedKeyMarker = "…#sha256:"

	// maxVerbatimFingerprintBytes is the longest fingerprint stored as-is;
	// longer ones (and invalid UTF-8) are stored as "sha256:" + 64 hex
	// digits (71 bytes), which no verbatim fingerprint can equal.
	maxVerbatimFingerprintBytes = 64
	hashedFingerprintPrefix     = "sha256:"
	maxStoredFingerprintBytes   = len(hashedFingerprintPrefix) + 2*sha256.Size
)

// maxPartitionKeyBytes is the longest partition key PartitionKey returns.
const maxPartitionKeyBytes = MaxVerbatimKeyBytes + len(hashedKeyMarker) + 2*sha256.Size

// PartitionKey returns the partition-key value under which the store keeps
// key. Keys of at most MaxVerbatimKeyBytes bytes are stored as they are, so
// they stay readable in the console and in dedupctl. Longer keys become
//
//	<the key's first ≤512 bytes, cut at a character boundary>…#sha256:<64 hex digits>
//
// where the digest is SHA-256 of the whole key: collision resistant, and
// between 584 and 587 bytes long, so a hashed key is always longer than any
// verbatim one and the two forms can never collide. The result stays well
// under DynamoDB's 2048-byte limit.
//
// It fails, with an error wrapping ErrInvalidKey, for the empty key
// (DynamoDB refuses empty key values) and for keys that are not valid UTF-8
// (the JSON protocol would replace the bad bytes, merging distinct keys).
func PartitionKey(key string) (string, error) {
	switch {
	case key == "":
		return "", fmt.Errorf("%w: the key is empty", ErrInvalidKey)
	case !utf8.ValidString(key):
		return "", fmt.Errorf("%w: the key is not valid UTF-8", ErrInvalidKey)
	case len(key) <= MaxVerbatimKeyBytes:
		return key, nil
	}
	cut := MaxVerbatimKeyBytes
	for cut > 0 && !utf8.RuneStart(key[cut]) {
		cut--
	}
	sum := sha256.Sum256([]byte(key))
	return key[:cut] + hashedKeyMarker + hex.EncodeToString(sum[:]), nil
}

// storedFingerprint returns the form of fingerprint kept in the item: as-is
// when short and valid UTF-8, otherwise a SHA-256 digest. Fingerprints are
// only compared for equality, so the digest compares exactly as the
// original (up to SHA-256 collisions) and bounds the item's size.
func storedFingerprint(fingerprint string) string {
	if len(fingerprint) <= maxVerbatimFingerprintBytes && utf8.ValidString(fingerprint) {
		return fingerprint
	}
	sum := sha256.Sum256([]byte(fingerprint))
	return hashedFingerprintPrefix + hex.EncodeToString(sum[:])
}
