package redis

import (
	"crypto/sha256"
	"fmt"
)

// Record encoding, format version 1. Every record is one Redis string:
//
//	offset  size  field
//	0       1     format version (1)
//	1       1     state: 'P' in progress, 'C' completed
//	2       16    owner token, raw bytes (the hex Claim.Token decoded)
//	18      1     n: length of the fingerprint digest (0 or 16 in version 1)
//	19      n     fingerprint digest: the first 16 bytes of SHA-256(fingerprint)
//	19+n    rest  result (completed records only), byte-exact
//
// The fixed header lets the Lua scripts compare state and token with
// string.sub, without decoding the rest. The result needs no length: it runs
// to the end of the value. A reader of a later format must keep reading
// version 1; a version 1 reader refuses any other version (ErrUnknownFormat)
// instead of guessing.
const (
	formatV1 byte = 1

	stateInProgress byte = 'P'
	stateCompleted  byte = 'C'

	tokenOffset = 2
	tokenLen    = 16
	fpLenOffset = tokenOffset + tokenLen // 18
	headerLen   = fpLenOffset + 1        // 19
	fpDigestLen = 16
)

// record is a decoded value.
type record struct {
	state  byte
	token  [tokenLen]byte
	fp     []byte // digest, empty when the claim had no fingerprint
	result []byte // nil when empty
}

// fingerprintDigest returns the stored form of a fingerprint: nil for none,
// else 16 bytes of its SHA-256. A fixed-size digest keeps records small and
// bounded whatever the caller's fingerprint (a hex SHA-256 is 64 bytes); two
// different fingerprints collide with probability 2^-128.
func fingerprintDigest(fingerprint string) []byte {
	if fingerprint == "" {
		return nil
	}
	sum := sha256.Sum256([]byte(fingerprint))
	return sum[:fpDigestLen]
}

// encodeInProgress returns the value a claim writes.
func encodeInProgress(token [tokenLen]byte, fpDigest []byte) []byte {
	b := make([]byte, 0, headerLen+len(fpDigest))
	b = append(b, formatV1, stateInProgress)
	b = append(b, token[:]...)
	b = append(b, byte(len(fpDigest)))
	return append(b, fpDigest...)
}

// decodeRecord parses a value. Anything not in format version 1 (another
// version, a truncated value, a value some other program stored under the
// key) gives an error wrapping ErrUnknownFormat.
func decodeRecord(v []byte) (record, error) {
	var r record
	if len(v) == 0 {
		return r, fmt.Errorf("%w: empty value", ErrUnknownFormat)
	}
	if v[0] != formatV1 {
		return r, fmt.Errorf("%w: format version %d", ErrUnknownFormat, v[0])
	}
	if len(v) < headerLen {
		return r, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrUnknownFormat, len(v), headerLen)
	}
	r.state = v[1]
	if r.state != stateInProgress && r.state != stateCompleted {
		return r, fmt.Errorf("%w: unknown state %q", ErrUnknownFormat, r.state)
	}
	copy(r.token[:], v[tokenOffset:tokenOffset+tokenLen])
	n := int(v[fpLenOffset])
	if len(v) < headerLen+n {
		return r, fmt.Errorf("%w: fingerprint of %d bytes runs past the end", ErrUnknownFormat, n)
	}
	if n > 0 {
		r.fp = v[headerLen : headerLen+n]
	}
	if rest := v[headerLen+n:]; len(rest) > 0 {
		r.result = rest
	}
	return r, nil
}
