package redis

import (
	"bytes"
	"errors"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

func TestRecordLayout(t *testing.T) {
	var token [tokenLen]byte
	for i := range token {
		token[i] = byte(0xf0 + i)
	}
	v := encodeInProgress(token, nil)
	want := append(append([]byte{1, 'P'}, token[:]...), 0)
	if !bytes.Equal(v, want) {
		t.Fatalf("in-progress record without fingerprint = %x, want %x", v, want)
	}
	if len(v) != 19 {
		t.Fatalf("typical record is %d bytes, want 19", len(v))
	}

	fp := fingerprintDigest("sha256-of-the-payload")
	if len(fp) != 16 {
		t.Fatalf("fingerprint digest is %d bytes, want 16", len(fp))
	}
	v = encodeInProgress(token, fp)
	r, err := decodeRecord(v)
	if err != nil {
		t.Fatal(err)
	}
	if r.state != stateInProgress || r.token != token || !bytes.Equal(r.fp, fp) || r.result != nil {
		t.Fatalf("decoded %+v", r)
	}

	// What the Complete script builds: state C, result appended.
	completed := append(append([]byte{1, 'C'}, v[2:]...), "result\x00\xff"...)
	r, err = decodeRecord(completed)
	if err != nil {
		t.Fatal(err)
	}
	if r.state != stateCompleted || !bytes.Equal(r.fp, fp) || string(r.result) != "result\x00\xff" {
		t.Fatalf("decoded %+v", r)
	}
}

func TestDecodeRefusesOtherFormats(t *testing.T) {
	var token [tokenLen]byte
	good := encodeInProgress(token, fingerprintDigest("x"))
	for name, v := range map[string][]byte{
		"nil":             nil,
		"version 0":       append([]byte{0}, good[1:]...),
		"version 2":       append([]byte{2}, good[1:]...),
		"truncated":       good[:18],
		"state":           append([]byte{1, 'x'}, good[2:]...),
		"fingerprint cut": good[:len(good)-1],
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
	res, err := outcomeOf(encodeInProgress(mine, fp), mine, fp, "k", "01")
	if err != nil || res.Outcome != dedup.Acquired || res.Claim != (dedup.Claim{Key: "k", Token: "01"}) {
		t.Fatalf("own record: %+v %v, want acquired", res, err)
	}
	res, err = outcomeOf(encodeInProgress(other, fp), mine, fp, "k", "01")
	if err != nil || res.Outcome != dedup.InProgress {
		t.Fatalf("another's record: %+v %v, want in progress", res, err)
	}
	res, err = outcomeOf(encodeInProgress(other, fp), mine, fingerprintDigest("b"), "k", "01")
	if err != nil || res.Outcome != dedup.Conflict {
		t.Fatalf("another fingerprint: %+v %v, want conflict", res, err)
	}
}

func FuzzDecodeRecord(f *testing.F) {
	var token [tokenLen]byte
	f.Add(encodeInProgress(token, nil))
	f.Add(encodeInProgress(token, fingerprintDigest("x")))
	f.Add([]byte{1, 'C'})
	f.Fuzz(func(t *testing.T, v []byte) {
		r, err := decodeRecord(v) // must not panic
		if err == nil && headerLen+len(r.fp)+len(r.result) != len(v) {
			t.Fatalf("decoded %d+%d+%d bytes of %d", headerLen, len(r.fp), len(r.result), len(v))
		}
	})
}
