package redis

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

func testToken() *[tokenLen]byte {
	var token [tokenLen]byte
	for i := range token {
		token[i] = byte(0xf0 + i)
	}
	return &token
}

func TestRecordLayout(t *testing.T) {
	token := testToken()
	v := appendInProgress(nil, token, nil, &provenance{}, 0)
	want := append(append([]byte{2, 'P'}, token[:]...), 10, fieldProvenance, 8, 0, 0, 0, 0, 0, 0, 0, 0)
	if !bytes.Equal(v, want) {
		t.Fatalf("in-progress record without fingerprint and ids = %x, want %x", v, want)
	}

	fp := fingerprintDigest("sha256-of-the-payload")
	if len(fp) != 16 {
		t.Fatalf("fingerprint digest is %d bytes, want 16", len(fp))
	}
	v = appendInProgress(nil, token, fp, &provenance{}, 0)
	if len(v) != headerLen+2+fpDigestLen+10 {
		t.Fatalf("in-progress record with fingerprint is %d bytes, want %d", len(v), headerLen+2+fpDigestLen+10)
	}
	r, err := decodeRecord(v)
	if err != nil {
		t.Fatal(err)
	}
	if r.state != stateInProgress || r.token != *token || !bytes.Equal(r.fp, fp) || r.result != nil {
		t.Fatalf("decoded %+v", r)
	}

	// What the Complete script builds from it: state C, the first 8 token
	// bytes, the fields, the result.
	completed := append(append([]byte{2, 'C'}, token[:8]...), v[18:]...)
	completed = append(completed, "result\x00\xff"...)
	r, err = decodeRecord(completed)
	if err != nil {
		t.Fatal(err)
	}
	if r.state != stateCompleted || !bytes.Equal(r.fp, fp) || string(r.result) != "result\x00\xff" {
		t.Fatalf("decoded %+v", r)
	}

	// The compact completed record: decimal digits, read as a completed
	// record without fingerprint or result.
	compact := appendCompact(nil, token)
	if n, err := strconv.ParseInt(string(compact), 10, 64); err != nil || strconv.FormatInt(n, 10) != string(compact) {
		t.Fatalf("compact record %q is not a canonical int64 (Redis would not keep it as an integer)", compact)
	}
	r, err = decodeRecord(compact)
	if err != nil || r.state != stateCompleted || r.fp != nil || r.result != nil {
		t.Fatalf("compact %q decoded %+v %v", compact, r, err)
	}
}

// The fence is field 4, 8 bytes big-endian; a reader takes 1 to 8 bytes,
// and a record without it (written before fencing) has fence 0. The
// completed record the client builds drops it: the same bytes as for the
// record without a fence.
func TestFenceField(t *testing.T) {
	token := testToken()
	p := provenance{claimedAt: 1789000000123, claims: 1}
	const fence = 1789000000123456
	v := appendInProgress(nil, token, nil, &p, fence)
	old := appendInProgress(nil, token, nil, &p, 0)
	want := append(append(append([]byte(nil), old...), fieldFence, 8), 0, 0x06, 0x5b, 0x16, 0x05, 0x82, 0xb2, 0x40)
	want[fieldsOffsetP] += fenceField
	if !bytes.Equal(v, want) {
		t.Fatalf("record with fence %d = %x, want %x", uint64(fence), v, want)
	}
	for name, c := range map[string]struct {
		v     []byte
		fence uint64
	}{
		"written":        {v, fence},
		"before fencing": {old, 0},
		"one byte":       {withFields(token, fieldFence, 1, 7), 7},
		"eight bytes":    {withFields(token, fieldFence, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe), 1<<64 - 2},
	} {
		r, err := decodeRecord(c.v)
		if err != nil || r.fence != c.fence {
			t.Errorf("%s: fence %d (%v), want %d", name, r.fence, err, c.fence)
		}
	}
	for name, v := range map[string][]byte{
		"empty":   withFields(token, fieldFence, 0),
		"9 bytes": withFields(token, fieldFence, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9),
		"cut":     withFields(token, fieldFence, 8, 1, 2),
	} {
		if _, err := decodeRecord(v); !errors.Is(err, ErrUnknownFormat) {
			t.Errorf("%s: %v, want ErrUnknownFormat", name, err)
		}
	}
	for _, omit := range []bool{false, true} {
		a, okA := appendCompleted(nil, string(v), 1789000000999, omit)
		b, okB := appendCompleted(nil, string(old), 1789000000999, omit)
		if okA != okB || !bytes.Equal(a, b) {
			t.Errorf("omit=%t: completed record of the fenced record %x (%v), of the record without fence %x (%v)", omit, a, okA, b, okB)
		}
	}
}

// withFields is an in-progress record with the given fields' bytes (their
// length byte computed, even when a field runs past them).
func withFields(token *[tokenLen]byte, fields ...byte) []byte {
	v := append(append([]byte{formatV2, stateInProgress}, token[:]...), byte(len(fields)))
	return append(v, fields...)
}

// A claim that takes over a released record writes a fence larger than
// the record's, whatever the clock says: the clock's time when the record
// has none or an older one, the record's fence plus one when that is not
// smaller (a record stamped by a clock ahead of this one).
func TestTakeoverFence(t *testing.T) {
	token, mine := testToken(), [tokenLen]byte{1}
	p := provenance{claimedAt: 1789000000123, claims: 2}
	released := func(fence uint64) []byte {
		v := appendInProgress(nil, token, nil, &p, fence)
		v[1] = stateReleased
		return v
	}
	ahead := uint64(time.Now().Add(time.Hour).UnixMicro())
	for _, prev := range []uint64{0, 1, uint64(time.Now().Add(-time.Hour).UnixMicro()), ahead} {
		before := uint64(time.Now().UnixMicro())
		value, fence, err := takeoverValue(released(prev), &mine, nil, dedup.Origin{})
		if err != nil {
			t.Fatal(err)
		}
		if fence <= prev || (prev < before && fence < before) || (prev == ahead && fence != ahead+1) {
			t.Errorf("takeover of a record with fence %d: fence %d", prev, fence)
		}
		r, err := decodeRecord(value)
		if err != nil || r.fence != fence || r.token != mine || r.state != stateInProgress {
			t.Errorf("takeover of fence %d wrote %+v (%v), want fence %d", prev, r, err, fence)
		}
		if q, ok := decodeProvenance(r.prov); !ok || q.claims != 3 || q.claimedAt != p.claimedAt {
			t.Errorf("takeover of fence %d: provenance %+v, want the record's with one more claim", prev, q)
		}
	}
}

// A field a later version adds (unknown tag) is skipped; the fingerprint
// is found after it.
func TestUnknownFieldsAreSkipped(t *testing.T) {
	token := testToken()
	fp := fingerprintDigest("x")
	fields := append([]byte{9, 3, 'a', 'b', 'c', fieldFingerprint, 16}, fp...)
	fields = append(fields, 10, 0) // an empty field
	v := append(append([]byte{2, 'C'}, token[:8]...), byte(len(fields)))
	v = append(append(v, fields...), "out"...)
	r, err := decodeRecord(v)
	if err != nil || r.state != stateCompleted || !bytes.Equal(r.fp, fp) || string(r.result) != "out" {
		t.Fatalf("decoded %+v %v", r, err)
	}
}

// Records of format version 1, written by the previous version, are read
// as before (a rolling upgrade meets them until their TTL ends).
func TestDecodeVersion1(t *testing.T) {
	token := testToken()
	fp := fingerprintDigest("x")
	inProgress := append(append(append([]byte{1, 'P'}, token[:]...), 16), fp...)
	r, err := decodeRecord(inProgress)
	if err != nil || r.state != stateInProgress || r.token != *token || !bytes.Equal(r.fp, fp) || r.result != nil {
		t.Fatalf("version 1 in progress: %+v %v", r, err)
	}
	completed := append(append(append([]byte{1, 'C'}, token[:]...), 0), "result"...)
	r, err = decodeRecord(completed)
	if err != nil || r.state != stateCompleted || r.fp != nil || string(r.result) != "result" {
		t.Fatalf("version 1 completed: %+v %v", r, err)
	}
}

func TestDecodeRefusesOtherFormats(t *testing.T) {
	token := testToken()
	good := appendInProgress(nil, token, fingerprintDigest("x"), &provenance{}, 0)
	goodV1 := append(append(append([]byte{1, 'P'}, token[:]...), 16), fingerprintDigest("x")...)
	for name, v := range map[string][]byte{
		"nil":                nil,
		"version 0":          append([]byte{0}, good[1:]...),
		"version 3":          append([]byte{3}, good[1:]...),
		"truncated":          good[:18],
		"truncated v1":       goodV1[:18],
		"state":              append([]byte{2, 'x'}, good[2:]...),
		"state v1":           append([]byte{1, 'x'}, goodV1[2:]...),
		"fields cut":         good[:len(good)-1],
		"fingerprint cut v1": goodV1[:len(goodV1)-1],
		"field runs past":    append(append([]byte{2, 'C'}, token[:8]...), 3, 1, 5, 0),
		"result in progress": append(append([]byte(nil), good...), 'r'),
		"digits then junk":   []byte("12a"),
		"completed cut":      append([]byte{2, 'C'}, token[:8]...),
	} {
		if _, err := decodeRecord(v); !errors.Is(err, ErrUnknownFormat) {
			t.Errorf("%s: %v, want ErrUnknownFormat", name, err)
		}
	}
}

// When go-redis retries SET NX PX GET after a network error and the first
// attempt had reached the server, the reply is the record this very claim
// wrote: that is an acquisition, not InProgress.
func TestOutcomeOfOwnRecord(t *testing.T) {
	var mine, other [tokenLen]byte
	mine[0], other[0] = 1, 2
	fp := fingerprintDigest("a")
	res, err := outcomeOf(appendInProgress(nil, &mine, fp, &provenance{}, 1789), mine, fp, "k", "01")
	if err != nil || res.Outcome != dedup.Acquired || res.Claim != (dedup.Claim{Key: "k", Token: "01", Fence: 1789}) {
		t.Fatalf("own record: %+v %v, want acquired with the record's fence", res, err)
	}
	res, err = outcomeOf(appendInProgress(nil, &other, fp, &provenance{}, 1789), mine, fp, "k", "01")
	if err != nil || res.Outcome != dedup.InProgress || res.Claim.Fence != 0 {
		t.Fatalf("another's record with a fence: %+v %v, want in progress without fence", res, err)
	}
	res, err = outcomeOf(appendInProgress(nil, &other, fp, &provenance{}, 0), mine, fp, "k", "01")
	if err != nil || res.Outcome != dedup.InProgress {
		t.Fatalf("another's record: %+v %v, want in progress", res, err)
	}
	res, err = outcomeOf(appendInProgress(nil, &other, fp, &provenance{}, 0), mine, fingerprintDigest("b"), "k", "01")
	if err != nil || res.Outcome != dedup.Conflict {
		t.Fatalf("another fingerprint: %+v %v, want conflict", res, err)
	}
	res, err = outcomeOf(appendCompact(nil, &mine), mine, fp, "k", "01")
	if err != nil || res.Outcome != dedup.Duplicate || res.Result != nil {
		t.Fatalf("compact completed: %+v %v, want duplicate", res, err)
	}
}

func TestParseBulkReply(t *testing.T) {
	for raw, want := range map[string]struct {
		v         string
		found, ok bool
	}{
		"_\r\n":                 {"", false, true},
		"$-1\r\n":               {"", false, true},
		"$0\r\n\r\n":            {"", true, true},
		"$5\r\nab\r\nc\r\n":     {"ab\r\nc", true, true},
		"$5\r\nabc\r\n":         {"", false, false},
		"-MOVED 1 a:1\r\n":      {"", false, false},
		"!5\r\nERROR\r\n":       {"", false, false},
		"+OK\r\n":               {"", false, false},
		"$99999999999\r\nx\r\n": {"", false, false},
	} {
		v, found, ok := parseBulkReply([]byte(raw))
		if string(v) != want.v || found != want.found || ok != want.ok {
			t.Errorf("%q: %q %v %v, want %q %v %v", raw, v, found, ok, want.v, want.found, want.ok)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	token := testToken()
	f.Add(appendInProgress(nil, token, nil, &provenance{}, 0))
	f.Add(appendInProgress(nil, token, fingerprintDigest("x"), &provenance{}, 0))
	f.Add(appendCompact(nil, token))
	f.Add([]byte{1, 'C'})
	f.Add(append(append([]byte{2, 'C'}, token[:8]...), 0, 'r'))
	f.Fuzz(func(t *testing.T, v []byte) {
		r, err := decodeRecord(v) // must not panic
		if err == nil && len(r.fp)+len(r.result) > len(v) {
			t.Fatalf("decoded %d+%d bytes of %d", len(r.fp), len(r.result), len(v))
		}
	})
}

// The provenance field keeps each kind of id exactly, and the largest one
// leaves room in the 255 bytes of fields for the fingerprint and the
// completed-at field the Complete script adds.
func TestProvenanceRoundTrip(t *testing.T) {
	long := strings.Repeat("é", dedup.MaxOriginIDLength/2) // 100 bytes
	uuid, sqs := "0b9f8e3c-4d1a-4e2b-9c3d-5e6f7a8b9c0d", "73fca7ac-78e9-4ea4-a1bf-71a92e2fbda8"
	for _, p := range []provenance{
		{},
		{claimedAt: 1789000000123, claims: 1, origin: dedup.Origin{TransportID: uuid}},
		{claimedAt: 1, claims: 300, origin: dedup.Origin{TransportID: uuid, MessageID: sqs}},
		{claimedAt: 1 << 47, claims: 1 << 40, origin: dedup.Origin{TransportID: "x", MessageID: "x"}},
		{claims: 2, origin: dedup.Origin{TransportID: strings.ToUpper(uuid), MessageID: "0/123"}},
		{claims: 2, origin: dedup.Origin{TransportID: uuid[:35], MessageID: strings.Replace(uuid, "-", "+", 1)}},
		{claims: 3, origin: dedup.Origin{MessageID: "sqs-only"}},
		{claimedAt: 1<<48 - 1, claims: 1<<64 - 1, origin: dedup.Origin{TransportID: long, MessageID: long[:98] + "."}},
	} {
		v := appendInProgress(nil, testToken(), fingerprintDigest("fp"), &p, 1<<63)
		// Complete drops the fence and adds completed-at (at most 12
		// bytes).
		if len(v) > maxInProgress || len(v) != headerLen+int(v[fieldsOffsetP]) || int(v[fieldsOffsetP])-fenceField > 255-12 {
			t.Errorf("%+v: record of %d bytes, fields of %d: no room for completed-at", p, len(v), v[fieldsOffsetP])
		}
		r, err := decodeRecord(v)
		if err != nil {
			t.Fatalf("%+v: %v", p, err)
		}
		got, ok := decodeProvenance(r.prov)
		if !ok || got != p {
			t.Errorf("round trip of %+v gave %+v (%v)", p, got, ok)
		}
	}
	var u [16]byte
	if !parseUUID(uuid, &u) || formatUUID(u[:]) != uuid {
		t.Errorf("UUID %q does not round-trip: %x", uuid, u)
	}
	for _, bad := range []string{strings.ToUpper(uuid), uuid[:35] + "g", "0b9f8e3c04d1a-4e2b-9c3d-5e6f7a8b9c0d"} {
		if parseUUID(bad, &u) {
			t.Errorf("%q parsed as a UUID", bad)
		}
	}
	for _, bad := range [][]byte{nil, {0, 0, 0, 0, 0, 0, 1}, {0, 0, 0, 0, 0, 0, 1, 1, 0}, {0, 0, 0, 0, 0, 0, 1, 2, 5, 'a'}, {0, 0, 0, 0, 0, 0, 1, 0x40}, {0, 0, 0, 0, 0, 0, 1, 0, 'x'}} {
		if p, ok := decodeProvenance(bad); ok {
			t.Errorf("malformed provenance %x decoded as %+v", bad, p)
		}
	}
}

// TestParseUUIDEveryByte puts every byte at every position of a UUID's text
// form: parseUUID accepts exactly the canonical lower-case form, and gives
// the bytes that hex decoding gives.
func TestParseUUIDEveryByte(t *testing.T) {
	const uuid = "0b9f8e3c-04d1-4e2b-9c3d-5e6f7a8b9c0d"
	for i := range len(uuid) {
		for c := range 256 {
			s := []byte(uuid)
			s[i] = byte(c)
			dash := i == 8 || i == 13 || i == 18 || i == 23
			want := dash && c == '-' || !dash && (c >= '0' && c <= '9' || c >= 'a' && c <= 'f')
			var u [16]byte
			if got := parseUUID(string(s), &u); got != want {
				t.Fatalf("parseUUID(%q) = %v, want %v", s, got, want)
			}
			if !want {
				continue
			}
			h, err := hex.DecodeString(strings.ReplaceAll(string(s), "-", ""))
			if err != nil || string(h) != string(u[:]) {
				t.Fatalf("parseUUID(%q) gave %x, want %x (%v)", s, u, h, err)
			}
		}
	}
}
