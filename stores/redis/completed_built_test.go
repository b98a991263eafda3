package redis_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// TestCompletedBuiltByClient: the completed record the client builds
// (sent with the in-progress record it was built from) and the one the
// Complete script builds from the record it finds are the same bytes, for
// every kind of in-progress record: with and without fingerprint,
// provenance with every kind of id, claimed in the past, the future or at
// the epoch, fields of later versions, with and without a fence (which
// neither keeps), with and without a result, with and without
// Config.OmitProvenance. The script takes the client's record only
// when the record under the key is the one expected.
func TestCompletedBuiltByClient(t *testing.T) {
	ctx := context.Background()
	client := newClient(t)
	stores := map[bool]*redis.Store{}
	for _, omit := range []bool{false, true} {
		stores[omit] = newStore(t, client, redis.Config{KeyPrefix: watchPrefix(fmt.Sprintf("%s-%t", t.Name(), omit)), OmitProvenance: omit})
	}
	now := time.Now().UnixMilli()
	long := strings.Repeat("x", 100)
	origins := []dedup.Origin{
		{},
		{TransportID: "1b4e28ba-2fa1-11d2-883f-0016d3cca427"},
		{TransportID: "1b4e28ba-2fa1-11d2-883f-0016d3cca427", MessageID: "order-42"},
		{TransportID: "msg-7", MessageID: "msg-7"},
		{TransportID: long, MessageID: long + "y"},
	}
	type rec struct {
		name string
		v    string
	}
	var recs []rec
	for _, fp := range []string{"", "sha256:payload"} {
		for _, at := range []int64{now - 5000, now - 10*24*3600*1000, now + 1000, 0, 1<<48 - 1} {
			for _, claims := range []uint64{1, 300, 1 << 63} {
				for i, o := range origins {
					// A fence (dropped on completion), or none: a record
					// written before fencing.
					fence := uint64(0)
					if (i+int(claims))%2 == 0 {
						fence = uint64(at)*1000 + 1
					}
					recs = append(recs, rec{fmt.Sprintf("fp=%q at=%d claims=%d origin=%d fence=%d", fp, at, claims, i, fence),
						redis.InProgressRecord(newToken(t), fp, at, claims, o, fence)})
				}
			}
		}
	}
	// Fields a later version may add (tags the script and the builder
	// carry over without knowing them), up to the 255 bytes of fields, so
	// that completed-at sometimes does not fit.
	for _, n := range []int{0, 200, 240, 250, 251, 252, 253, 255} {
		base := redis.InProgressRecord(newToken(t), "fp", now-1234, 2, origins[2], uint64(now)*1000)
		fields := base[19:]
		if pad := n - len(fields) - 2; pad >= 0 {
			fields += string([]byte{9, byte(pad)}) + strings.Repeat("z", pad)
		}
		recs = append(recs, rec{fmt.Sprintf("fields of %d bytes", len(fields)), base[:18] + string([]byte{byte(len(fields))}) + fields})
	}

	for _, r := range recs {
		for _, omit := range []bool{false, true} {
			for _, result := range [][]byte{nil, []byte("result\x00\xff")} {
				name := fmt.Sprintf("%s omit=%t result=%t", r.name, omit, result != nil)
				store := stores[omit]
				var token [16]byte
				copy(token[:], r.v[2:18])
				set := func(key, v string) {
					if err := client.Set(ctx, store.RedisKey(key), v, time.Minute).Err(); err != nil {
						t.Fatal(err)
					}
				}
				complete := func(key, built, expected string) string {
					reply, err := store.RunComplete(ctx, key, token, result, now, built, expected)
					if err != nil || reply != 0 {
						t.Fatalf("%s: Complete script on %s: reply %d, %v", name, key, reply, err)
					}
					v, err := client.Get(ctx, store.RedisKey(key)).Result()
					if err != nil {
						t.Fatal(err)
					}
					return v
				}
				set("script", r.v)
				byScript := complete("script", "", "")
				built, ok := redis.AppendCompleted(r.v, now, omit)
				if !ok {
					if !omit || strings.Contains(r.name, "fields of") || strings.Contains(r.name, `fp="sha`) {
						t.Errorf("%s: the client built no record", name)
					}
					continue
				}
				set("client", r.v)
				if got := complete("client", built, r.v); got != byScript {
					t.Errorf("%s:\n client built %x\n script built %x", name, got, byScript)
				}

				// The script takes the client's record, and only when the
				// record is the one the client expected.
				set("marked", r.v)
				if got, want := complete("marked", "\x02Cmarked", r.v), "\x02Cmarked"+string(result); got != want {
					t.Errorf("%s: the script wrote %x, want the client's %x", name, got, want)
				}
				other := r.v[:len(r.v)-1] + string([]byte{r.v[len(r.v)-1] ^ 1})
				set("other", other)
				set("other-script", other)
				if got, want := complete("other", "\x02Cmarked", r.v), complete("other-script", "", ""); got != want {
					t.Errorf("%s: on another record than expected the script wrote %x, want %x", name, got, want)
				}
			}
		}
	}
	t.Logf("%d in-progress records compared", len(recs))
}

// newToken returns a random owner token.
func newToken(t *testing.T) [16]byte {
	var token [16]byte
	if _, err := rand.Read(token[:]); err != nil {
		t.Fatal(err)
	}
	return token
}

// TestEngineSendsTheCompletedRecord: the engine's Complete of a claim the
// store made sends the completed record built by the client, built from
// the in-progress record the claim wrote, and the record becomes that.
func TestEngineSendsTheCompletedRecord(t *testing.T) {
	restore := redis.CaptureCompleteArgs()
	defer restore()
	withAndWithoutAutoPipeline(t, func(t *testing.T, client *goredis.Client, store *redis.Store) {
		ctx := context.Background()
		e, err := dedup.NewEngine(dedup.Config{Store: store, Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		var key, inProgress string
		_, err = e.Do(ctx, dedup.Call{Scope: "orders", Key: "order-1", MessageUUID: "1b4e28ba-2fa1-11d2-883f-0016d3cca427", Fingerprint: "fp"},
			func(ctx context.Context) ([]byte, error) {
				hc, ok := dedup.HeldClaimFromContext(ctx)
				if !ok {
					return nil, fmt.Errorf("no claim in the work's context")
				}
				key = store.RedisKey(hc.Claim().Key)
				inProgress, err = client.Get(ctx, key).Result()
				return nil, err
			})
		if err != nil {
			t.Fatal(err)
		}
		built, expected, completed := capturedComplete(t, client, key)
		if expected != inProgress || built == "" || !strings.HasPrefix(built, "\x02C") || completed != built {
			t.Fatalf("Complete sent built %x from expected %x (the claim wrote %x); the record is %x", built, expected, inProgress, completed)
		}
	})
}

// TestDirectCompleteSendsTheCompletedRecord: Claim.Token is the
// in-progress record the claim wrote, so that Store.Complete called
// directly (without the engine's context) also sends the completed record
// built by the client, expecting that record; a claim's token passed to
// Extend and Release still identifies its owner, and a token of 16 raw
// bytes (an earlier version's) still completes, the script building the
// record. (Before, only the engine's Complete found the record.)
func TestDirectCompleteSendsTheCompletedRecord(t *testing.T) {
	restore := redis.CaptureCompleteArgs()
	defer restore()
	withAndWithoutAutoPipeline(t, func(t *testing.T, client *goredis.Client, store *redis.Store) {
		ctx := context.Background() // the fingerprint gives the record a field
		res, err := store.Claim(ctx, "direct", "fp", time.Minute)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("Claim: %v %v", res.Outcome, err)
		}
		key := store.RedisKey("direct")
		inProgress, err := client.Get(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if res.Claim.Token != inProgress {
			t.Fatalf("Claim.Token %x, want the in-progress record %x", res.Claim.Token, inProgress)
		}
		if err := store.Extend(ctx, res.Claim, time.Minute); err != nil {
			t.Fatalf("Extend with the claim's token: %v", err)
		}
		if err := store.Complete(context.Background(), res.Claim, []byte("r"), time.Hour); err != nil {
			t.Fatal(err)
		}
		built, expected, completed := capturedComplete(t, client, key)
		if expected != inProgress || built == "" || completed != built+"r" {
			t.Fatalf("Complete sent built %x from expected %x (the claim wrote %x); the record is %x", built, expected, inProgress, completed)
		}

		// A token of the owner's 16 raw bytes alone: the script builds
		// the same record.
		res, err = store.Claim(ctx, "raw-token", "fp", time.Minute)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("Claim: %v %v", res.Outcome, err)
		}
		short := dedup.Claim{Key: res.Claim.Key, Token: res.Claim.Token[2:18]}
		if err := store.Complete(context.Background(), short, []byte("r"), time.Hour); err != nil {
			t.Fatalf("Complete with the 16-byte token: %v", err)
		}
		built, _ = client.Get(ctx, store.RedisKey("raw-token")+"#built").Result()
		if built != "" {
			t.Errorf("a 16-byte token sent a built record %x", built)
		}
		dup, err := store.Claim(ctx, "raw-token", "fp", time.Minute)
		if err != nil || dup.Outcome != dedup.Duplicate || string(dup.Result) != "r" {
			t.Errorf("Claim after Complete with the 16-byte token: %v %q %v", dup.Outcome, dup.Result, err)
		}

		// Release with the record token.
		res, err = store.Claim(ctx, "released", "", time.Minute)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("Claim: %v %v", res.Outcome, err)
		}
		if err := store.Release(ctx, res.Claim); err != nil {
			t.Fatalf("Release with the claim's token: %v", err)
		}
		if again, err := store.Claim(ctx, "released", "", time.Minute); err != nil || again.Outcome != dedup.Acquired {
			t.Errorf("Claim after Release: %v %v", again.Outcome, err)
		}
	})
}

// capturedComplete returns what CaptureCompleteArgs recorded of the last
// Complete of key (the built record and the expected one) and the record
// now under key.
func capturedComplete(t *testing.T, client *goredis.Client, key string) (built, expected, completed string) {
	t.Helper()
	ctx := context.Background()
	built, err1 := client.Get(ctx, key+"#built").Result()
	expected, err2 := client.Get(ctx, key+"#expected").Result()
	completed, err3 := client.Get(ctx, key).Result()
	if err1 != nil || err2 != nil || err3 != nil {
		t.Fatal(err1, err2, err3)
	}
	return built, expected, completed
}

// TestBatchCompleteSendsTheCompletedRecord: ClaimBatch's tokens are the
// in-progress records, as Claim's, and CompleteBatch sends each completed
// record built by the client, with the record it expects; a record
// changed since (here: completed by Complete first) is left to the
// script, which answers as before. (Before, the batch's tokens were the
// 16 raw bytes and the script built every record.)
func TestBatchCompleteSendsTheCompletedRecord(t *testing.T) {
	restore := redis.CaptureCompleteArgs()
	defer restore()
	withAndWithoutAutoPipeline(t, func(t *testing.T, client *goredis.Client, store *redis.Store) {
		ctx := context.Background()
		reqs := []dedup.ClaimRequest{
			{Key: "batch-1", Fingerprint: "fp", Lease: time.Minute, Origin: dedup.Origin{TransportID: "m-1"}},
			{Key: "batch-2", Fingerprint: "fp", Lease: time.Minute, Origin: dedup.Origin{TransportID: "m-2"}},
		}
		res, errs := store.ClaimBatch(ctx, reqs)
		var done []dedup.CompleteRequest
		inProgress := map[string]string{}
		for i, r := range res {
			if errs[i] != nil || r.Outcome != dedup.Acquired {
				t.Fatalf("ClaimBatch %d: %v %v", i, r.Outcome, errs[i])
			}
			v, err := client.Get(ctx, store.RedisKey(r.Claim.Key)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if r.Claim.Token != v {
				t.Fatalf("ClaimBatch token %x, want the in-progress record %x", r.Claim.Token, v)
			}
			inProgress[r.Claim.Key] = v
			done = append(done, dedup.CompleteRequest{Claim: r.Claim, Result: []byte("r"), Retention: time.Hour})
		}
		if err := store.Complete(ctx, res[1].Claim, []byte("r"), time.Hour); err != nil {
			t.Fatal(err)
		}
		errs2 := store.CompleteBatch(ctx, done)
		if errs2[0] != nil || !errors.Is(errs2[1], redis.ErrAlreadyCompleted) {
			t.Fatalf("CompleteBatch: %v, want nil and ErrAlreadyCompleted", errs2)
		}
		built, expected, completed := capturedComplete(t, client, store.RedisKey("batch-1"))
		if expected != inProgress["batch-1"] || built == "" || completed != built+"r" {
			t.Fatalf("CompleteBatch sent built %x from expected %x (the claim wrote %x); the record is %x", built, expected, inProgress["batch-1"], completed)
		}
	})
}
