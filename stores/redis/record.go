package redis

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"
)

// Record encoding. Every record is one Redis string, in one of three forms
// told apart by its first byte. This version writes version 2 and the
// compact form, and reads all three (records of version 1 stay readable
// during a rolling upgrade; a process of the previous version refuses
// version 2 and compact records with ErrUnknownFormat, so the messages it
// meets them with are nacked, not acked, until it is upgraded).
//
// Version 2, in progress (written by Claim):
//
//	offset  size  field
//	0       1     format version (2)
//	1       1     state: 'P'
//	2       16    owner token, raw bytes (Claim.Token)
//	18      1     n: length of the fields
//	19      n     fields
//
// Version 2, completed (written by the Complete script when the record has
// fields or a result):
//
//	0       1     format version (2)
//	1       1     state: 'C'
//	2       8     the first 8 bytes of the owner token (enough to tell a
//	              retried Complete of the same claim from another's)
//	10      1     n: length of the fields
//	11      n     fields
//	11+n    rest  result, byte-exact
//
// Fields are tag, length, value (one byte each for tag and length). Tag 1
// is the fingerprint digest (16 bytes). A reader skips tags it does not
// know, so later versions can add fields (the first claim's transport id,
// timestamps, a claim counter) without a new format version; the Complete
// script carries every field of the in-progress record over.
//
// Compact, completed: the decimal digits of the first 8 bytes of the owner
// token read as a big-endian integer and halved (so that it fits a signed
// 64-bit integer), for a completed record without fields or result, the
// usual case. Redis keeps a value that is a canonical decimal integer
// inside its 16-byte object header instead of a separate string, which
// saves 16 bytes per record (see README.md for used_memory per record).
//
// Version 1 (read only):
//
//	0       1     format version (1)
//	1       1     state: 'P' or 'C'
//	2       16    owner token
//	18      1     n: length of the fingerprint digest (0 or 16)
//	19      n     fingerprint digest
//	19+n    rest  result (completed records only)
//
// The fixed header lets the Lua scripts compare state and token with
// string.sub, without decoding the rest.
const (
	formatV1 byte = 1
	formatV2 byte = 2

	stateInProgress byte = 'P'
	stateCompleted  byte = 'C'

	tokenOffset   = 2
	tokenLen      = 16
	tokenPrefix   = 8                      // token bytes a version 2 completed record keeps
	fieldsOffsetP = tokenOffset + tokenLen // 18: the fields' length byte, in progress (and version 1)
	fieldsOffsetC = tokenOffset + tokenPrefix
	headerLen     = fieldsOffsetP + 1 // 19
	fpDigestLen   = 16

	fieldFingerprint byte = 1
)

// record is a decoded value.
type record struct {
	state byte
	// token is the owner token of an in-progress record (the whole token
	// for version 1 records in either state).
	token  [tokenLen]byte
	fp     []byte // digest, empty when the claim had no fingerprint
	result []byte // nil when empty
}

// fingerprintDigest returns the stored form of a fingerprint: nil for none,
// else 16 bytes of its SHA-256. A fixed-size digest keeps records small and
// bounded whatever the caller's fingerprint (a hex SHA-256 is 64 bytes); two
// different fingerprints collide with probability 2^-128. (Not inlined: the
// hash's state would sit in every claim's stack frame.)
//
//go:noinline
func fingerprintDigest(fingerprint string) []byte {
	if fingerprint == "" {
		return nil
	}
	sum := sha256.Sum256([]byte(fingerprint))
	return sum[:fpDigestLen]
}

// maxInProgress is the length of the largest in-progress record this
// version writes.
const maxInProgress = headerLen + 2 + fpDigestLen

// appendInProgress appends the value a claim writes.
func appendInProgress(b []byte, token *[tokenLen]byte, fpDigest []byte) []byte {
	b = append(b, formatV2, stateInProgress)
	b = append(b, token[:]...)
	if len(fpDigest) == 0 {
		return append(b, 0)
	}
	b = append(b, byte(2+len(fpDigest)), fieldFingerprint, byte(len(fpDigest)))
	return append(b, fpDigest...)
}

// appendCompact appends the compact completed record of a token (see
// the format): the token's first 8 bytes as a big-endian integer, halved,
// in decimal. The scripts compare it to tell a completed record of this
// claim.
func appendCompact(b []byte, token *[tokenLen]byte) []byte {
	return strconv.AppendUint(b, binary.BigEndian.Uint64(token[:tokenPrefix])>>1, 10)
}

// decodeRecord parses a value. Anything not in one of the three forms (a
// truncated value, a value some other program stored under the key, a
// later format version) gives an error wrapping ErrUnknownFormat.
func decodeRecord(v []byte) (record, error) {
	var r record
	if len(v) == 0 {
		return r, fmt.Errorf("%w: empty value", ErrUnknownFormat)
	}
	switch {
	case v[0] >= '0' && v[0] <= '9':
		for _, c := range v {
			if c < '0' || c > '9' {
				return r, fmt.Errorf("%w: %d bytes starting with a digit, not a decimal integer", ErrUnknownFormat, len(v))
			}
		}
		r.state = stateCompleted
		return r, nil
	case v[0] == formatV1:
		return decodeV1(v)
	case v[0] == formatV2:
		return decodeV2(v)
	default:
		return r, fmt.Errorf("%w: format version %d", ErrUnknownFormat, v[0])
	}
}

func decodeV1(v []byte) (record, error) {
	var r record
	if len(v) < headerLen {
		return r, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrUnknownFormat, len(v), headerLen)
	}
	r.state = v[1]
	if r.state != stateInProgress && r.state != stateCompleted {
		return r, fmt.Errorf("%w: unknown state %q", ErrUnknownFormat, r.state)
	}
	copy(r.token[:], v[tokenOffset:tokenOffset+tokenLen])
	n := int(v[fieldsOffsetP])
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

func decodeV2(v []byte) (record, error) {
	var r record
	if len(v) < 2 {
		return r, fmt.Errorf("%w: %d bytes, shorter than the header", ErrUnknownFormat, len(v))
	}
	r.state = v[1]
	var at int // the fields' length byte
	switch r.state {
	case stateInProgress:
		at = fieldsOffsetP
	case stateCompleted:
		at = fieldsOffsetC
	default:
		return r, fmt.Errorf("%w: unknown state %q", ErrUnknownFormat, r.state)
	}
	if len(v) <= at {
		return r, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrUnknownFormat, len(v), at+1)
	}
	if r.state == stateInProgress {
		copy(r.token[:], v[tokenOffset:tokenOffset+tokenLen])
	}
	n := int(v[at])
	fields := v[at+1:]
	if len(fields) < n {
		return r, fmt.Errorf("%w: fields of %d bytes run past the end", ErrUnknownFormat, n)
	}
	fields, rest := fields[:n], fields[n:]
	for len(fields) > 0 {
		if len(fields) < 2 || len(fields) < 2+int(fields[1]) {
			return r, fmt.Errorf("%w: a field runs past the fields' end", ErrUnknownFormat)
		}
		tag, value := fields[0], fields[2:2+int(fields[1])]
		if tag == fieldFingerprint && len(value) > 0 {
			r.fp = value
		}
		fields = fields[2+len(value):]
	}
	if len(rest) > 0 {
		if r.state == stateInProgress {
			return r, fmt.Errorf("%w: an in-progress record with a result", ErrUnknownFormat)
		}
		r.result = rest
	}
	return r, nil
}
