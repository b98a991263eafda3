package postgres_test

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// A row written by an earlier version (fingerprint in the text column
// verbatim) still compares correctly: a rolling upgrade sees the same
// payload as a duplicate, another payload as a conflict. And the columns
// hold what the README says: verbatim text, or "\x01sha256:<hex>" for
// fingerprints the text column cannot hold.
func TestFingerprintRowsOfEarlierVersions(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t, postgres.Config{})
	hexFP := func(b []byte) string { sum := sha256.Sum256(b); return hex.EncodeToString(sum[:]) }
	verbatim := []string{
		hexFP([]byte("payload")), // keyfuncs.PayloadFingerprint's form
		"fp", "注文 🚀", "sha256:" + hexFP([]byte("x")), "a\tb\x1b",
	}
	for i, fp := range verbatim {
		key := admin.ScopedKey("upgrade", hexFP([]byte{byte(i)}))
		// The row exactly as the earlier version's claim and complete wrote it.
		_, err := pool.Exec(ctx, `INSERT INTO `+s.Table()+` (key_hash, key, state, token, fingerprint, lease_until, expires_at, result)
			VALUES (sha256(convert_to($1::text, 'UTF8')), $1::text, 'completed', $2::text, $3::text, NULL, clock_timestamp() + interval '1 hour', '\x6f6b'::bytea)`,
			key, storekit.NewToken(), fp)
		if err != nil {
			t.Fatalf("insert the earlier version's row: %v", err)
		}
		res, err := s.Claim(ctx, key, fp, time.Minute)
		if err != nil || res.Outcome != dedup.Duplicate || string(res.Result) != "ok" {
			t.Fatalf("fingerprint %q of an earlier row: %v %v %q, want duplicate with its result", fp, res.Outcome, err, res.Result)
		}
		if res, err := s.Claim(ctx, key, fp+"x", time.Minute); err != nil || res.Outcome != dedup.Conflict {
			t.Fatalf("other fingerprint on an earlier row: %v %v, want conflict", res.Outcome, err)
		}
	}

	raw := sha256.Sum256([]byte("payload"))
	for _, c := range []struct{ fp, column string }{
		{"fp", "fp"},
		{string(raw[:]), "\x01sha256:" + hexFP(raw[:])},
		{"a\x00b", "\x01sha256:" + hexFP([]byte("a\x00b"))},
		{"\xff", "\x01sha256:" + hexFP([]byte("\xff"))},
		{"\x01verbatim-looking", "\x01sha256:" + hexFP([]byte("\x01verbatim-looking"))},
	} {
		key := admin.ScopedKey("columns", hexFP([]byte(c.fp)))
		if res, err := s.Claim(ctx, key, c.fp, time.Minute); err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("claim with fingerprint %q: %v %v", c.fp, res.Outcome, err)
		}
		r, ok := readRecord(t, s, key)
		if !ok || r.Fingerprint != c.column {
			t.Fatalf("fingerprint %q is stored as %q, want %q", c.fp, r.Fingerprint, c.column)
		}
	}
}
