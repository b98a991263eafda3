package redis_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// v1Record builds a record of format version 1, as the previous version of
// the store wrote it.
func v1Record(state byte, token string, fingerprint string, result string) string {
	v := []byte{1, state}
	v = append(v, token...)
	if fingerprint == "" {
		v = append(v, 0)
	} else {
		sum := sha256.Sum256([]byte(fingerprint))
		v = append(append(v, 16), sum[:16]...)
	}
	return string(append(v, result...))
}

// TestVersion1RecordsAreRead: during a rolling upgrade the store meets
// records of format version 1 written by the previous version. A claim
// reads them (Duplicate with the stored result, InProgress, Conflict on
// another fingerprint), and the token-checking scripts classify them (an
// in-progress record of this token is completed into the new format;
// another's is not touched).
func TestVersion1RecordsAreRead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := newClient(t)
	store := newStore(t, client, redis.Config{KeyPrefix: "v1compat:"})
	other := string(make([]byte, 16))
	set := func(key, value string) {
		t.Helper()
		if err := client.Set(ctx, store.RedisKey(admin.ScopedKey("s", key)), value, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}

	set("done", v1Record('C', other, "fp", "stored result"))
	res, err := store.Claim(ctx, admin.ScopedKey("s", "done"), "fp", time.Minute)
	if err != nil || res.Outcome != dedup.Duplicate || string(res.Result) != "stored result" {
		t.Fatalf("claim of a version 1 completed record: %+v %v, want Duplicate with its result", res, err)
	}
	res, err = store.Claim(ctx, admin.ScopedKey("s", "done"), "another fp", time.Minute)
	if err != nil || res.Outcome != dedup.Conflict {
		t.Fatalf("claim with another fingerprint: %+v %v, want Conflict", res, err)
	}

	set("busy", v1Record('P', other, "", ""))
	res, err = store.Claim(ctx, admin.ScopedKey("s", "busy"), "", time.Minute)
	if err != nil || res.Outcome != dedup.InProgress {
		t.Fatalf("claim of a version 1 in-progress record: %+v %v, want InProgress", res, err)
	}
	if err := store.Complete(ctx, dedup.Claim{Key: admin.ScopedKey("s", "busy"), Token: "0123456789abcdef"}, nil, time.Hour); !errors.Is(err, redis.ErrNotOwner) {
		t.Fatalf("complete of another's version 1 record: %v, want ErrNotOwner", err)
	}
	if err := store.Release(ctx, dedup.Claim{Key: admin.ScopedKey("s", "done"), Token: other}); !errors.Is(err, redis.ErrAlreadyCompleted) {
		t.Fatalf("release of a version 1 completed record of the same token: %v, want ErrAlreadyCompleted", err)
	}

	// A version 1 in-progress record with a fingerprint, completed with its
	// token by this version: the fingerprint survives into the new format.
	const mine = "fedcba9876543210"
	set("mine", v1Record('P', mine, "fp", ""))
	claim := dedup.Claim{Key: admin.ScopedKey("s", "mine"), Token: mine}
	if err := store.Extend(ctx, claim, time.Minute); err != nil {
		t.Fatalf("extend of an own version 1 record: %v", err)
	}
	if err := store.Complete(ctx, claim, []byte("r"), time.Hour); err != nil {
		t.Fatalf("complete of an own version 1 record: %v", err)
	}
	res, err = store.Claim(ctx, admin.ScopedKey("s", "mine"), "another fp", time.Minute)
	if err != nil || res.Outcome != dedup.Conflict {
		t.Fatalf("claim with another fingerprint after the upgrade: %+v %v, want Conflict", res, err)
	}
	if err := store.Complete(ctx, claim, []byte("r"), time.Hour); !errors.Is(err, dedup.ErrAlreadyCompleted) {
		t.Fatalf("second complete: %v, want ErrAlreadyCompleted", err)
	}
	rec, err := store.Inspect(ctx, admin.ScopedKey("s", "mine"))
	if err != nil || rec.State != admin.StateCompleted || rec.ResultSize != 1 || rec.Fingerprint == "" {
		t.Fatalf("inspect: %+v %v", rec, err)
	}
}

// TestCompletedRecordIsAnInteger: with Config.OmitProvenance a completed
// record without fingerprint or result is stored as a decimal integer,
// which Redis keeps in its object header (OBJECT ENCODING int): what makes
// a record 16 bytes smaller. The same claim's retry recognises it
// (ErrAlreadyCompleted), another claim's does not (ErrNotOwner), and a
// claim of the key is a Duplicate.
func TestCompletedRecordIsAnInteger(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := newClient(t)
	store := newStore(t, client, redis.Config{KeyPrefix: "compact:", OmitProvenance: true})
	key := admin.ScopedKey("s", "k")
	res, err := store.Claim(dedup.WithOrigin(ctx, uuidOrigin), key, "", time.Minute)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if err := store.Complete(ctx, res.Claim, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	if enc, err := client.ObjectEncoding(ctx, store.RedisKey(key)).Result(); err != nil || enc != "int" {
		t.Fatalf("OBJECT ENCODING of a completed record: %q %v, want int", enc, err)
	}
	if err := store.Complete(ctx, res.Claim, nil, time.Hour); !errors.Is(err, dedup.ErrAlreadyCompleted) {
		t.Fatalf("retried complete: %v, want ErrAlreadyCompleted", err)
	}
	stranger := dedup.Claim{Key: key, Token: string(append([]byte{^res.Claim.Token[0]}, res.Claim.Token[1:]...))}
	if err := store.Release(ctx, stranger); !errors.Is(err, redis.ErrNotOwner) {
		t.Fatalf("release by another token: %v, want ErrNotOwner", err)
	}
	again, err := store.Claim(ctx, key, "any fp", time.Minute)
	if err != nil || again.Outcome != dedup.Duplicate || again.Result != nil {
		t.Fatalf("claim of a completed key: %+v %v, want Duplicate without result", again, err)
	}
	rec, err := store.Inspect(ctx, key)
	if err != nil || rec.State != admin.StateCompleted || rec.Fingerprint != "" || rec.ResultSize != 0 {
		t.Fatalf("inspect: %+v %v", rec, err)
	}
	if !rec.ClaimedAt.IsZero() || !rec.CompletedAt.IsZero() || rec.TransportID != "" || rec.MessageID != "" || rec.Claims != 0 {
		t.Fatalf("inspect: a record without provenance shows %+v", rec)
	}
}

// uuidOrigin is what the Watermill middleware passes for a message
// of watermill-aws: its UUID and no other id.
var uuidOrigin = dedup.Origin{TransportID: "0b9f8e3c-4d1a-4e2b-9c3d-5e6f7a8b9c0d"}

// TestCompletedRecordIsEmbedded: by default a completed record keeps its
// provenance; with a UUID transport id and no other id, no fingerprint and
// no result, it stays within the 44 bytes Redis keeps inside its object
// header (OBJECT ENCODING embstr), one allocation of 64 bytes, whatever
// the time between claim and completion (its completed-at is a delta of
// up to 3 bytes below 35 minutes). Inspect decodes the provenance.
func TestCompletedRecordIsEmbedded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := newClient(t)
	store := newStore(t, client, redis.Config{KeyPrefix: "embstr:"})
	for _, o := range []dedup.Origin{uuidOrigin, {TransportID: uuidOrigin.TransportID, MessageID: uuidOrigin.TransportID}} {
		key := admin.ScopedKey("s", o.MessageID+"k")
		res, err := store.Claim(dedup.WithOrigin(ctx, o), key, "", time.Minute)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("claim: %+v %v", res, err)
		}
		if err := store.Complete(ctx, res.Claim, nil, time.Hour); err != nil {
			t.Fatal(err)
		}
		enc, err := client.ObjectEncoding(ctx, store.RedisKey(key)).Result()
		n, err2 := client.StrLen(ctx, store.RedisKey(key)).Result()
		if err != nil || err2 != nil || enc != "embstr" || n > 44-3 {
			t.Fatalf("origin %+v: completed record of %d bytes, OBJECT ENCODING %q (%v, %v); want embstr with room for a 3-byte delta", o, n, enc, err, err2)
		}
		rec, err := store.Inspect(ctx, key)
		if err != nil || rec.TransportID != o.TransportID || rec.MessageID != o.MessageID || rec.Claims != 1 ||
			rec.ClaimedAt.IsZero() || rec.CompletedAt.Before(rec.ClaimedAt) {
			t.Fatalf("inspect: %+v %v", rec, err)
		}
	}
}

// TestRecordsWithoutFence: records written before fencing have no fence
// field. A released one is taken over with a fence by this process's
// clock (older than any fence it could have had: none), and the record
// written then carries it, so the next takeover's fence is larger; an
// in-progress one is InProgress as before, and its owner (a process of the
// previous version) completes it. A record with a fence is the format the
// previous version reads too: it skips field 4 as it skips every field it
// does not know (TestUnknownFieldsAreSkipped).
func TestRecordsWithoutFence(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := newClient(t)
	store := newStore(t, client, redis.Config{KeyPrefix: "nofence:"})
	key := admin.ScopedKey("s", "released")
	old := []byte(redis.InProgressRecord(newToken(t), "", time.Now().Add(-time.Second).UnixMilli(), 1, uuidOrigin, 0))
	old[1] = 'R'
	if err := client.Set(ctx, store.RedisKey(key), old, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	before := uint64(time.Now().UnixMicro())
	res, err := store.Claim(ctx, key, "", time.Minute)
	if err != nil || res.Outcome != dedup.Acquired || res.Claim.Fence < before {
		t.Fatalf("claim of a released record without fence: %+v %v, want Acquired with a fence of at least %d", res, err, before)
	}
	if rec, err := store.Inspect(ctx, key); err != nil || rec.Claims != 2 || rec.TransportID != uuidOrigin.TransportID {
		t.Fatalf("inspect after the takeover: %+v %v, want the old record's provenance and 2 claims", rec, err)
	}
	if err := store.Release(ctx, res.Claim); err != nil {
		t.Fatal(err)
	}
	next, err := store.Claim(ctx, key, "", time.Minute)
	if err != nil || next.Outcome != dedup.Acquired || next.Claim.Fence <= res.Claim.Fence {
		t.Fatalf("next takeover: %+v %v, want a fence larger than %d", next, err, res.Claim.Fence)
	}

	// An in-progress record of the previous version: InProgress; its
	// owner's token completes it.
	token := newToken(t)
	busy := admin.ScopedKey("s", "busy")
	if err := client.Set(ctx, store.RedisKey(busy), redis.InProgressRecord(token, "", time.Now().UnixMilli(), 1, uuidOrigin, 0), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if res, err := store.Claim(ctx, busy, "", time.Minute); err != nil || res.Outcome != dedup.InProgress || res.Claim.Fence != 0 {
		t.Fatalf("claim of an in-progress record without fence: %+v %v, want InProgress", res, err)
	}
	if err := store.Complete(ctx, dedup.Claim{Key: busy, Token: string(token[:])}, nil, time.Hour); err != nil {
		t.Fatalf("complete of a record without fence by its owner's token: %v", err)
	}
}
