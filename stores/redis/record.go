package redis

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/watermill-dedup/watermill-dedup/dedup"
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
//	2       16    owner token, raw bytes (the whole record is Claim.Token)
//	18      1     n: length of the fields
//	19      n     fields
//
// Version 2, completed (written by the Complete script when the record has
// fields or a result; built by the client, appendCompleted, from the
// in-progress record that Claim.Token is, else by the script, byte for
// byte the same):
//
//	0       1     format version (2)
//	1       1     state: 'C'
//	2       8     the first 8 bytes of the owner token (enough to tell a
//	              retried Complete of the same claim from another's)
//	10      1     n: length of the fields
//	11      n     fields
//	11+n    rest  result, byte-exact
//
// Version 2, released (written by the Release script): the in-progress
// record with state 'R'. Every operation treats it as no record; a claim
// that finds it replaces it with its own in-progress record, keeping its
// provenance and counting one more claim. It keeps the TTL of the lease.
//
// Fields are tag, length, value (one byte each for tag and length), at
// most 255 bytes in all. A reader skips tags it does not know, so later
// versions can add fields without a new format version; the Complete
// script carries every field of the in-progress record over but the
// fence.
//
//	tag  written by  value
//	1    Claim       the fingerprint digest (16 bytes)
//	2    Claim       provenance: the first claim's time (6 bytes, Unix
//	                 milliseconds, big-endian), the number of claims
//	                 (uvarint), one byte of id kinds (transport id in the
//	                 low 4 bits, message id in the high 4: 0 none, 1 a
//	                 UUID as 16 raw bytes, 2 text as uvarint length and
//	                 bytes, 3 (message id only) the same as the transport
//	                 id), then the transport id and the message id
//	3    Complete    completed-at: milliseconds after the first claim's
//	                 time (uvarint); left out with field 2
//	                 (Config.OmitProvenance)
//	4    Claim       the fence (dedup.Claim.Fence), big-endian: 8 bytes
//	                 written, 1 to 8 read. In-progress and released
//	                 records keep it, for the claim that takes the record
//	                 over (storekit.NextFence); Complete drops it: a
//	                 completed record is never taken over, only deleted
//	                 (its TTL, Evict), and it stays as small as before.
//	                 A record without it (written before fencing, or
//	                 taken over by a process of that version) has fence
//	                 0. The previous version skips the field as unknown,
//	                 and carries it into the completed records it writes.
//
// A completed record of a claim with a Watermill UUID and no other id,
// without fingerprint and result, is 40 to 42 bytes: Redis keeps it
// embedded in its object header (44 bytes at most, "embstr").
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
	stateReleased   byte = 'R'

	tokenOffset   = 2
	tokenLen      = 16
	tokenPrefix   = 8                      // token bytes a version 2 completed record keeps
	fieldsOffsetP = tokenOffset + tokenLen // 18: the fields' length byte, in progress (and version 1)
	fieldsOffsetC = tokenOffset + tokenPrefix
	headerLen     = fieldsOffsetP + 1 // 19
	fpDigestLen   = 16

	fieldFingerprint    byte = 1
	fieldProvenance     byte = 2
	fieldCompletedAfter byte = 3
	fieldFence          byte = 4

	// fenceField is the length of the fence field as written: tag,
	// length, 8 bytes.
	fenceField = 2 + 8

	// Id kinds of the provenance field.
	idNone byte = 0
	idUUID byte = 1
	idText byte = 2
	idSame byte = 3

	// maxProvenance is the longest provenance field, tag and length
	// included: ids are at most dedup.MaxOriginIDLength (100) bytes.
	maxProvenance = 2 + 6 + binary.MaxVarintLen64 + 1 + 2*(1+dedup.MaxOriginIDLength)
)

// record is a decoded value.
type record struct {
	state byte
	// token is the owner token of an in-progress record (the whole token
	// for version 1 records in either state).
	token  [tokenLen]byte
	fp     []byte // digest, empty when the claim had no fingerprint
	result []byte // nil when empty
	// prov and completedAfter are the values of fields 2 and 3, if any.
	prov, completedAfter []byte
	// fence is field 4, 0 when the record has none.
	fence uint64
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

// maxInProgress is the length of the largest in-progress record this
// version writes.
const maxInProgress = headerLen + 2 + fpDigestLen + maxProvenance + fenceField

// provenance is the decoded provenance field (see the format).
type provenance struct {
	claimedAt int64 // Unix milliseconds
	claims    uint64
	origin    dedup.Origin
}

// appendInProgress appends the value a claim writes: its token, the
// fingerprint digest (if any), provenance and the claim's fence (none
// when 0).
func appendInProgress(b []byte, token *[tokenLen]byte, fpDigest []byte, p *provenance, fence uint64) []byte {
	b = append(b, formatV2, stateInProgress)
	b = append(b, token[:]...)
	n := len(b)
	b = append(b, 0)
	if len(fpDigest) > 0 {
		b = append(b, fieldFingerprint, byte(len(fpDigest)))
		b = append(b, fpDigest...)
	}
	b = appendProvenance(b, p)
	if fence != 0 {
		b = append(b, fieldFence, 8)
		b = binary.BigEndian.AppendUint64(b, fence)
	}
	b[n] = byte(len(b) - n - 1)
	return b
}

// appendProvenance appends field 2.
func appendProvenance(b []byte, p *provenance) []byte {
	b = append(b, fieldProvenance, 0)
	start := len(b)
	at := min(max(p.claimedAt, 0), 1<<48-1)
	b = append(b, byte(at>>40), byte(at>>32), byte(at>>24), byte(at>>16), byte(at>>8), byte(at))
	b = binary.AppendUvarint(b, p.claims)
	kinds := len(b)
	b = append(b, 0)
	var tk, mk byte
	b, tk = appendID(b, p.origin.TransportID)
	if p.origin.MessageID != "" && p.origin.MessageID == p.origin.TransportID {
		mk = idSame
	} else {
		b, mk = appendID(b, p.origin.MessageID)
	}
	b[kinds] = tk | mk<<4
	b[start-1] = byte(len(b) - start)
	return b
}

// appendID appends an id of the provenance field and returns its kind.
func appendID(b []byte, id string) ([]byte, byte) {
	var u [16]byte
	switch {
	case id == "":
		return b, idNone
	case parseUUID(id, &u):
		return append(b, u[:]...), idUUID
	}
	id = id[:min(len(id), dedup.MaxOriginIDLength)]
	b = binary.AppendUvarint(b, uint64(len(id)))
	return append(b, id...), idText
}

// parseUUID parses a UUID in its canonical lower-case text form (the form
// that formatUUID gives back, so that the id round-trips exactly).
func parseUUID(s string, u *[16]byte) bool {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return false
	}
	bad := byte(0)
	for j, i := range uuidDigits {
		hi, lo := lowerHex[s[i]], lowerHex[s[i+1]]
		bad |= hi | lo
		u[j] = hi<<4 | lo&0x0f
	}
	return bad&0xf0 == 0
}

// uuidDigits are where the 16 bytes of a UUID's text form start.
var uuidDigits = [16]uint8{0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34}

// lowerHex is the value of each lower-case hex digit, 0xff for any other
// byte.
var lowerHex = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = byte(c - '0')
	}
	for c := 'a'; c <= 'f'; c++ {
		t[c] = byte(c - 'a' + 10)
	}
	return t
}()

// formatUUID is the canonical text form of a UUID.
func formatUUID(u []byte) string {
	h := hex.EncodeToString(u)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// decodeProvenance parses field 2; ok is false when it is malformed.
func decodeProvenance(v []byte) (p provenance, ok bool) {
	if len(v) < 8 {
		return p, false
	}
	for _, c := range v[:6] {
		p.claimedAt = p.claimedAt<<8 | int64(c)
	}
	v = v[6:]
	claims, n := binary.Uvarint(v)
	if n <= 0 || len(v) <= n {
		return p, false
	}
	p.claims, v = claims, v[n:]
	kinds := v[0]
	v = v[1:]
	if p.origin.TransportID, v, ok = decodeID(v, kinds&0xf); !ok {
		return p, false
	}
	if kinds>>4 == idSame {
		p.origin.MessageID = p.origin.TransportID
		return p, len(v) == 0
	}
	p.origin.MessageID, v, ok = decodeID(v, kinds>>4)
	return p, ok && len(v) == 0
}

func decodeID(v []byte, kind byte) (string, []byte, bool) {
	switch kind {
	case idNone:
		return "", v, true
	case idUUID:
		if len(v) < 16 {
			return "", v, false
		}
		return formatUUID(v[:16]), v[16:], true
	case idText:
		n, k := binary.Uvarint(v)
		if k <= 0 || uint64(len(v)-k) < n {
			return "", v, false
		}
		return string(v[k : k+int(n)]), v[k+int(n):], true
	}
	return "", v, false
}

// appendCompact appends the compact completed record of a token (see
// the format): the token's first 8 bytes as a big-endian integer, halved,
// in decimal. The scripts compare it to tell a completed record of this
// claim.
func appendCompact(b []byte, token *[tokenLen]byte) []byte {
	return strconv.AppendUint(b, binary.BigEndian.Uint64(token[:tokenPrefix])>>1, 10)
}

// maxCompletedHeader is the length of the largest version 2 completed
// record without its result.
const maxCompletedHeader = fieldsOffsetC + 1 + 255

// appendCompleted appends what the Complete script writes for the version
// 2 in-progress record v, completed at now (Unix milliseconds), before the
// result: the same bytes, built here so that the server does not have to
// (see Store.Complete). It mirrors completeSrc's builder field for field:
// every field is kept but the provenance with omitProvenance, and field 3
// (completed-at, after the provenance's claimed-at) is added when it fits;
// the fence is dropped. ok is false when the record would keep no field
// (the script then writes the compact form or the result alone) or v is
// not such a record.
func appendCompleted(b []byte, v string, now int64, omitProvenance bool) (_ []byte, ok bool) {
	if len(v) < headerLen || v[0] != formatV2 || v[1] != stateInProgress || len(v) != headerLen+int(v[fieldsOffsetP]) {
		return b, false
	}
	fields := v[headerLen:]
	b = append(b, formatV2, stateCompleted)
	b = append(b, v[tokenOffset:tokenOffset+tokenPrefix]...)
	n := len(b)
	b = append(b, 0)
	var at int64
	haveAt := false
	for i := 0; i+1 < len(fields); {
		t, l := fields[i], int(fields[i+1])
		end := i + 2 + l
		if end > len(fields) {
			return b[:n-fieldsOffsetC], false // not written by this version
		}
		switch {
		case t == fieldFence:
		case t != fieldProvenance:
			b = append(b, fields[i:end]...)
		case !omitProvenance:
			b = append(b, fields[i:end]...)
			if l >= 6 {
				at, haveAt = 0, true
				for k := i + 2; k < i+8; k++ {
					at = at<<8 | int64(fields[k])
				}
			}
		}
		i = end
	}
	if haveAt {
		var u [binary.MaxVarintLen64]byte
		d := binary.PutUvarint(u[:], uint64(max(now-at, 0)))
		if len(b)-n-1+2+d <= 255 {
			b = append(b, fieldCompletedAfter, byte(d))
			b = append(b, u[:d]...)
		}
	}
	if len(b) == n+1 {
		return b[:n-fieldsOffsetC], false
	}
	b[n] = byte(len(b) - n - 1)
	return b, true
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
	case stateInProgress, stateReleased:
		at = fieldsOffsetP
	case stateCompleted:
		at = fieldsOffsetC
	default:
		return r, fmt.Errorf("%w: unknown state %q", ErrUnknownFormat, r.state)
	}
	if len(v) <= at {
		return r, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrUnknownFormat, len(v), at+1)
	}
	if r.state != stateCompleted {
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
		switch {
		case tag == fieldFingerprint && len(value) > 0:
			r.fp = value
		case tag == fieldProvenance:
			r.prov = value
		case tag == fieldCompletedAfter:
			r.completedAfter = value
		case tag == fieldFence:
			if len(value) == 0 || len(value) > 8 {
				return r, fmt.Errorf("%w: a fence of %d bytes", ErrUnknownFormat, len(value))
			}
			r.fence = 0
			for _, c := range value {
				r.fence = r.fence<<8 | uint64(c)
			}
		}
		fields = fields[2+len(value):]
	}
	if len(rest) > 0 {
		if r.state != stateCompleted {
			return r, fmt.Errorf("%w: an in-progress record with a result", ErrUnknownFormat)
		}
		r.result = rest
	}
	return r, nil
}
