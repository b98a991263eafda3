package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
)

// batchCases are the cases RunBatch runs, in order.
var batchCases = []suiteCase{
	{"BatchNewKeys", TestBatchNewKeys},
	{"BatchDuplicates", TestBatchDuplicates},
	{"BatchLiveHeldKeys", TestBatchLiveHeldKeys},
	{"BatchTakeover", TestBatchTakeover},
	{"BatchKeyReuse", TestBatchKeyReuse},
	{"BatchSameKeyTwice", TestBatchSameKeyTwice},
	{"BatchMixed", TestBatchMixed},
	{"BatchEmpty", TestBatchEmpty},
	{"BatchLargerThanOneRequest", TestBatchLargerThanOneRequest},
	{"BatchCompleteAndReleaseCheckTokens", TestBatchCompleteAndReleaseCheckTokens},
	{"BatchOrigin", TestBatchOrigin},
	{"BatchOneRequest", TestBatchOneRequest},
	{"BatchFences", TestBatchFences},
}

// RunBatch runs every case of the batch capability (dedup.BatchStore:
// ClaimBatch, CompleteBatch, ReleaseBatch) in parallel, each with a store
// from newStore and keys of its own. It needs Features.Batch: without it
// every case is skipped.
func RunBatch(t *testing.T, newStore Constructor, features Features) {
	t.Helper()
	runAll(t, batchCases, newStore, features)
}

// batchEnv is a case's environment with the store's batch methods.
type batchEnv struct {
	*env
	bs dedup.BatchStore
}

func newBatchEnv(t *testing.T, name string, newStore Constructor, features Features) *batchEnv {
	t.Helper()
	if !features.Batch {
		t.Skip("storetest: the store has no batch capability (Features.Batch)")
	}
	e := newEnv(t, name, newStore, features)
	bs, ok := e.store.(dedup.BatchStore)
	if !ok {
		t.Fatalf("storetest: Features.Batch is set, but %T does not implement dedup.BatchStore", e.store)
	}
	return &batchEnv{env: e, bs: bs}
}

// claims claims reqs with one ClaimBatch and checks the answer's shape.
func (e *batchEnv) claims(reqs ...dedup.ClaimRequest) ([]dedup.ClaimResult, []error) {
	e.t.Helper()
	res, errs := e.bs.ClaimBatch(e.ctx, reqs)
	if len(res) != len(reqs) || len(errs) != len(reqs) {
		e.t.Fatalf("ClaimBatch of %d records answered %d results and %d errors", len(reqs), len(res), len(errs))
	}
	return res, errs
}

// expectBatch claims reqs with one ClaimBatch and requires each outcome
// in want (no error).
func (e *batchEnv) expectBatch(reqs []dedup.ClaimRequest, want ...dedup.Outcome) []dedup.ClaimResult {
	e.t.Helper()
	res, errs := e.claims(reqs...)
	for i := range reqs {
		if errs[i] != nil {
			e.t.Fatalf("ClaimBatch record %d (%.40q): %v", i, reqs[i].Key, errs[i])
		}
		if res[i].Outcome != want[i] {
			e.t.Fatalf("ClaimBatch record %d (%.40q) = %v, want %v", i, reqs[i].Key, res[i].Outcome, want[i])
		}
		switch {
		case want[i] == dedup.Acquired && (res[i].Claim.Token == "" || res[i].Claim.Key != reqs[i].Key):
			e.t.Fatalf("ClaimBatch record %d acquired with claim %+v, want a token and key %.40q", i, res[i].Claim, reqs[i].Key)
		case want[i] != dedup.Acquired && res[i].Claim.Token != "":
			e.t.Fatalf("ClaimBatch record %d (%v) carries a claim token", i, res[i].Outcome)
		}
	}
	return res
}

// completeAll completes claims with one CompleteBatch and requires success.
func (e *batchEnv) completeAll(claims []dedup.Claim, results [][]byte) {
	e.t.Helper()
	reqs := make([]dedup.CompleteRequest, len(claims))
	for i, c := range claims {
		reqs[i] = dedup.CompleteRequest{Claim: c, Result: results[i], Retention: longLease}
	}
	errs := e.bs.CompleteBatch(e.ctx, reqs)
	if len(errs) != len(reqs) {
		e.t.Fatalf("CompleteBatch of %d records answered %d errors", len(reqs), len(errs))
	}
	for i, err := range errs {
		if err != nil {
			e.t.Fatalf("CompleteBatch record %d (%.40q): %v", i, claims[i].Key, err)
		}
	}
}

// releaseAll releases claims with one ReleaseBatch and requires success.
func (e *batchEnv) releaseAll(claims []dedup.Claim) {
	e.t.Helper()
	errs := e.bs.ReleaseBatch(e.ctx, claims)
	if len(errs) != len(claims) {
		e.t.Fatalf("ReleaseBatch of %d claims answered %d errors", len(claims), len(errs))
	}
	for i, err := range errs {
		if err != nil {
			e.t.Fatalf("ReleaseBatch record %d (%.40q): %v", i, claims[i].Key, err)
		}
	}
}

func req(key, fp string) dedup.ClaimRequest {
	return dedup.ClaimRequest{Key: key, Fingerprint: fp, Lease: longLease}
}

func outcomes(n int, o dedup.Outcome) []dedup.Outcome {
	out := make([]dedup.Outcome, n)
	for i := range out {
		out[i] = o
	}
	return out
}

// TestBatchNewKeys: a batch of new keys is acquired, each with a token of
// its own; completed with one CompleteBatch, the same batch is then all
// duplicates with their results.
func TestBatchNewKeys(t *testing.T, newStore Constructor, features Features) {
	e := newBatchEnv(t, "BatchNewKeys", newStore, features)
	var reqs []dedup.ClaimRequest
	for i := range 5 {
		reqs = append(reqs, req(e.key(fmt.Sprint(i)), "fp"))
	}
	res := e.expectBatch(reqs, outcomes(5, dedup.Acquired)...)
	tokens := map[string]bool{}
	var claims []dedup.Claim
	var results [][]byte
	for i, r := range res {
		if tokens[r.Claim.Token] {
			t.Fatalf("two records of the batch got the same token")
		}
		tokens[r.Claim.Token] = true
		claims = append(claims, r.Claim)
		results = append(results, []byte(fmt.Sprintf("result-%d", i)))
	}
	e.expectBatch(reqs, outcomes(5, dedup.InProgress)...)
	e.completeAll(claims, results)
	for i, r := range e.expectBatch(reqs, outcomes(5, dedup.Duplicate)...) {
		if !bytes.Equal(r.Result, results[i]) {
			t.Fatalf("record %d: duplicate result %q, want %q", i, r.Result, results[i])
		}
	}
	e.expect(reqs[0].Key, "fp", dedup.Duplicate) // the single path agrees
}

// TestBatchDuplicates: keys completed one by one are duplicates in a batch,
// with their results byte for byte (nil among them).
func TestBatchDuplicates(t *testing.T, newStore Constructor, features Features) {
	e := newBatchEnv(t, "BatchDuplicates", newStore, features)
	results := [][]byte{[]byte(`{"charged":150}`), nil, {0, 1, 2, 255}}
	var reqs []dedup.ClaimRequest
	for i, r := range results {
		c := e.acquire(e.key(fmt.Sprint(i)), "", longLease)
		e.complete(c, r, longLease)
		reqs = append(reqs, req(c.Key, ""))
	}
	for i, r := range e.expectBatch(reqs, outcomes(len(reqs), dedup.Duplicate)...) {
		if !bytes.Equal(r.Result, results[i]) {
			t.Fatalf("record %d: duplicate result %q, want %q", i, r.Result, results[i])
		}
	}
}

// TestBatchLiveHeldKeys: keys held by live claims are InProgress in a
// batch, and their owners still complete them.
func TestBatchLiveHeldKeys(t *testing.T, newStore Constructor, features Features) {
	e := newBatchEnv(t, "BatchLiveHeldKeys", newStore, features)
	a, b := e.acquire(e.key("a"), "fp", longLease), e.acquire(e.key("b"), "", longLease)
	e.expectBatch([]dedup.ClaimRequest{req(a.Key, "fp"), req(b.Key, "fp")}, dedup.InProgress, dedup.InProgress)
	e.complete(a, []byte("a"), longLease)
	e.complete(b, nil, longLease)
}

// TestBatchTakeover: a released record, an in-progress record whose lease
// ended and a completed record whose retention ended are acquired by a
// batch; their old claims are lost.
func TestBatchTakeover(t *testing.T, newStore Constructor, features Features) {
	e := newBatchEnv(t, "BatchTakeover", newStore, features)
	short := e.features.ShortDuration
	released := e.acquire(e.key("released"), "fp", longLease)
	if err := e.store.Release(e.ctx, released); err != nil {
		t.Fatalf("Release: %v", err)
	}
	abandoned := e.acquire(e.key("abandoned"), "fp", short)
	expired := e.acquire(e.key("expired"), "fp", longLease)
	e.complete(expired, []byte("old"), short)
	e.wait(2 * short)
	reqs := []dedup.ClaimRequest{req(released.Key, "fp"), req(abandoned.Key, "fp"), req(expired.Key, "other")}
	res := e.expectBatch(reqs, dedup.Acquired, dedup.Acquired, dedup.Acquired)
	for i, old := range []dedup.Claim{released, abandoned, expired} {
		if res[i].Claim.Token == old.Token {
			t.Fatalf("record %d: the takeover reused the old token", i)
		}
	}
	expectClaimLost(t, "Complete with the abandoned claim", e.store.Complete(e.ctx, abandoned, nil, longLease))
	expectClaimLost(t, "Release with the released claim", e.store.Release(e.ctx, released))
	e.expectBatch(reqs, dedup.InProgress, dedup.InProgress, dedup.InProgress)
}

// TestBatchKeyReuse: a key recorded with another fingerprint is a Conflict
// in a batch, in either state, without the stored result.
func TestBatchKeyReuse(t *testing.T, newStore Constructor, features Features) {
	e := newBatchEnv(t, "BatchKeyReuse", newStore, features)
	held := e.acquire(e.key("held"), "fp-a", longLease)
	done := e.acquire(e.key("done"), "fp-a", longLease)
	e.complete(done, []byte("r"), longLease)
	res := e.expectBatch([]dedup.ClaimRequest{req(held.Key, "fp-b"), req(done.Key, "fp-b")}, dedup.Conflict, dedup.Conflict)
	if res[1].Result != nil {
		t.Fatalf("a conflict returned the stored result %q", res[1].Result)
	}
	e.expectBatch([]dedup.ClaimRequest{req(held.Key, "fp-a"), req(done.Key, "")}, dedup.InProgress, dedup.Duplicate)
}

// TestBatchSameKeyTwice: the same key twice in one batch is claimed as if
// the two claims ran one after the other: the first acquires, the second
// finds its record (InProgress, or Conflict under another fingerprint).
func TestBatchSameKeyTwice(t *testing.T, newStore Constructor, features Features) {
	e := newBatchEnv(t, "BatchSameKeyTwice", newStore, features)
	k, l := e.key("k"), e.key("l")
	res := e.expectBatch([]dedup.ClaimRequest{req(k, "fp"), req(l, "fp-a"), req(k, "fp"), req(l, "fp-b")},
		dedup.Acquired, dedup.Acquired, dedup.InProgress, dedup.Conflict)
	e.completeAll([]dedup.Claim{res[0].Claim, res[1].Claim}, [][]byte{[]byte("k"), []byte("l")})
	e.expect(k, "fp", dedup.Duplicate)
}

// TestBatchMixed: one batch mixing a new key, a duplicate, a held key, a
// released record, a conflict, a repeated key and a record with an invalid
// lease: each gets its own answer, and only the invalid one an error
// (ErrInvalidDuration).
func TestBatchMixed(t *testing.T, newStore Constructor, features Features) {
	e := newBatchEnv(t, "BatchMixed", newStore, features)
	dup := e.acquire(e.key("dup"), "fp", longLease)
	e.complete(dup, []byte("dup"), longLease)
	held := e.acquire(e.key("held"), "fp", longLease)
	released := e.acquire(e.key("released"), "fp", longLease)
	if err := e.store.Release(e.ctx, released); err != nil {
		t.Fatalf("Release: %v", err)
	}
	reqs := []dedup.ClaimRequest{
		req(e.key("new"), "fp"), req(dup.Key, "fp"), req(held.Key, "fp"), req(released.Key, "fp"),
		req(dup.Key, "other"), req(e.key("new"), "fp"),
		{Key: e.key("invalid"), Lease: 0},
	}
	res, errs := e.claims(reqs...)
	want := []dedup.Outcome{dedup.Acquired, dedup.Duplicate, dedup.InProgress, dedup.Acquired, dedup.Conflict, dedup.InProgress}
	for i, w := range want {
		if errs[i] != nil || res[i].Outcome != w {
			t.Fatalf("record %d (%.40q) = %v, %v; want %v", i, reqs[i].Key, res[i].Outcome, errs[i], w)
		}
	}
	if !bytes.Equal(res[1].Result, []byte("dup")) {
		t.Fatalf("duplicate result %q, want %q", res[1].Result, "dup")
	}
	if !errors.Is(errs[6], dedup.ErrInvalidDuration) {
		t.Fatalf("record with lease 0: %v, want ErrInvalidDuration", errs[6])
	}
	// Nothing was claimed under the invalid record's key.
	e.acquire(e.key("invalid"), "", longLease)
	e.completeAll([]dedup.Claim{res[0].Claim, res[3].Claim}, [][]byte{nil, []byte("r")})
	e.expectBatch(reqs[:4], dedup.Duplicate, dedup.Duplicate, dedup.InProgress, dedup.Duplicate)
}

// TestBatchEmpty: an empty batch answers empty slices, with no error.
func TestBatchEmpty(t *testing.T, newStore Constructor, features Features) {
	e := newBatchEnv(t, "BatchEmpty", newStore, features)
	res, errs := e.bs.ClaimBatch(e.ctx, nil)
	if len(res) != 0 || len(errs) != 0 {
		t.Fatalf("ClaimBatch(nil) = %d results, %d errors", len(res), len(errs))
	}
	if errs := e.bs.CompleteBatch(e.ctx, nil); len(errs) != 0 {
		t.Fatalf("CompleteBatch(nil) = %d errors", len(errs))
	}
	if errs := e.bs.ReleaseBatch(e.ctx, nil); len(errs) != 0 {
		t.Fatalf("ReleaseBatch(nil) = %d errors", len(errs))
	}
}

// TestBatchLargerThanOneRequest: a batch of more records than one request
// carries (Features.BatchRequestSize) is split and still correct: every
// record acquired once; half completed and half released together; then
// the completed half is duplicate and the released half acquired again.
func TestBatchLargerThanOneRequest(t *testing.T, newStore Constructor, features Features) {
	e := newBatchEnv(t, "BatchLargerThanOneRequest", newStore, features)
	n := 1000
	if s := e.features.BatchRequestSize; s > 0 {
		n = 2*s + 1
	}
	reqs := make([]dedup.ClaimRequest, n)
	for i := range reqs {
		reqs[i] = req(e.key(fmt.Sprint(i)), "")
	}
	res := e.expectBatch(reqs, outcomes(n, dedup.Acquired)...)
	var done, released []dedup.Claim
	var results [][]byte
	for i, r := range res {
		if i%2 == 0 {
			done, results = append(done, r.Claim), append(results, []byte(fmt.Sprint(i)))
		} else {
			released = append(released, r.Claim)
		}
	}
	e.completeAll(done, results)
	e.releaseAll(released)
	want := make([]dedup.Outcome, n)
	for i := range want {
		want[i] = dedup.Acquired
		if i%2 == 0 {
			want[i] = dedup.Duplicate
		}
	}
	for i, r := range e.expectBatch(reqs, want...) {
		if i%2 == 0 && string(r.Result) != fmt.Sprint(i) {
			t.Fatalf("record %d: result %q", i, r.Result)
		}
	}
}

// TestBatchCompleteAndReleaseCheckTokens: CompleteBatch and ReleaseBatch act
// only on records that carry the claim's token, record by record: a stale
// or foreign claim gets ErrClaimLost (a retried completion of its own
// record, ErrAlreadyCompleted where the store tells it) while the others
// of the same batch succeed.
func TestBatchCompleteAndReleaseCheckTokens(t *testing.T, newStore Constructor, features Features) {
	e := newBatchEnv(t, "BatchCompleteAndReleaseCheckTokens", newStore, features)
	a, b, c := e.acquire(e.key("a"), "", longLease), e.acquire(e.key("b"), "", longLease), e.acquire(e.key("c"), "", longLease)
	foreign := dedup.Claim{Key: b.Key, Token: a.Token}
	errs := e.bs.CompleteBatch(e.ctx, []dedup.CompleteRequest{
		{Claim: a, Result: []byte("a"), Retention: longLease},
		{Claim: foreign, Result: []byte("x"), Retention: longLease},
		{Claim: a, Result: []byte("a"), Retention: longLease}, // completed by the first
	})
	if len(errs) != 3 || errs[0] != nil {
		t.Fatalf("CompleteBatch = %v, want the first to succeed", errs)
	}
	expectClaimLost(t, "CompleteBatch with another record's token", errs[1])
	expectClaimLost(t, "CompleteBatch retried in the same batch", errs[2])
	if e.features.AlreadyCompleted && !errors.Is(errs[2], dedup.ErrAlreadyCompleted) {
		t.Fatalf("CompleteBatch retried in the same batch: %v, want ErrAlreadyCompleted", errs[2])
	}
	errs = e.bs.ReleaseBatch(e.ctx, []dedup.Claim{c, foreign, a, c})
	if len(errs) != 4 || errs[0] != nil {
		t.Fatalf("ReleaseBatch = %v, want the first to succeed", errs)
	}
	expectClaimLost(t, "ReleaseBatch with another record's token", errs[1])
	expectClaimLost(t, "ReleaseBatch of a completed record", errs[2])
	expectClaimLost(t, "ReleaseBatch of a released record", errs[3])
	e.expectBatch([]dedup.ClaimRequest{req(a.Key, ""), req(b.Key, ""), req(c.Key, "")}, dedup.Duplicate, dedup.InProgress, dedup.Acquired)
	e.complete(b, nil, longLease)
}

// TestBatchOrigin: a record created by a batch keeps its request's
// Origin, as a single claim keeps its context's (needs Features.Admin and
// Provenance; otherwise it only checks the claims succeed).
func TestBatchOrigin(t *testing.T, newStore Constructor, features Features) {
	e := newBatchEnv(t, "BatchOrigin", newStore, features)
	reqs := []dedup.ClaimRequest{req(e.key("a"), ""), req(e.key("b"), "")}
	reqs[0].Origin = dedup.Origin{TransportID: "uuid-a", MessageID: "msg-a"}
	reqs[1].Origin = dedup.Origin{TransportID: "uuid-b"}
	e.expectBatch(reqs, dedup.Acquired, dedup.Acquired)
	ops, ok := e.store.(admin.Interface)
	if !e.features.Admin || !e.features.Provenance || !ok {
		return
	}
	for _, r := range reqs {
		rec, err := ops.Inspect(e.ctx, r.Key)
		if err != nil {
			t.Fatalf("Inspect(%.40q): %v", r.Key, err)
		}
		if rec.TransportID != r.Origin.TransportID || rec.MessageID != r.Origin.MessageID || rec.Claims != 1 {
			t.Fatalf("record %.40q: origin %q/%q, %d claims; want %q/%q, 1", r.Key, rec.TransportID, rec.MessageID, rec.Claims, r.Origin.TransportID, r.Origin.MessageID)
		}
	}
}

// TestBatchOneRequest: with Features.OneRequestBatch, a ClaimBatch of ten
// new keys is one request, and so are the CompleteBatch of five of them
// and the ReleaseBatch of the other five (the store must implement
// RequestCounter and be the case's own).
func TestBatchOneRequest(t *testing.T, newStore Constructor, features Features) {
	if !features.OneRequestBatch {
		t.Skip("storetest: the store does not promise one request per batch (Features.OneRequestBatch)")
	}
	e := newBatchEnv(t, "BatchOneRequest", newStore, features)
	counter, ok := e.store.(RequestCounter)
	if !ok {
		t.Fatalf("storetest: Features.OneRequestBatch needs a store that implements storetest.RequestCounter; %T does not", e.store)
	}
	reqs := make([]dedup.ClaimRequest, 10)
	for i := range reqs {
		reqs[i] = req(e.key(fmt.Sprint(i)), "fp")
	}
	measure := func(what string, f func()) {
		t.Helper()
		before := counter.Requests()
		f()
		if n := counter.Requests() - before; n != 1 {
			t.Fatalf("%s took %d requests, want 1", what, n)
		}
	}
	// A first batch may open a connection (the client's handshake), and
	// load a script the server did not know: warm up.
	warm := e.expectBatch([]dedup.ClaimRequest{req(e.key("warm-up"), ""), req(e.key("warm-up-2"), "")}, dedup.Acquired, dedup.Acquired)
	e.completeAll([]dedup.Claim{warm[0].Claim}, [][]byte{nil})
	e.releaseAll([]dedup.Claim{warm[1].Claim})
	var res []dedup.ClaimResult
	measure("ClaimBatch of 10 new keys", func() { res = e.expectBatch(reqs, outcomes(10, dedup.Acquired)...) })
	var done, released []dedup.Claim
	for i, r := range res {
		if i < 5 {
			done = append(done, r.Claim)
		} else {
			released = append(released, r.Claim)
		}
	}
	measure("CompleteBatch of 5", func() { e.completeAll(done, make([][]byte, 5)) })
	measure("ReleaseBatch of 5", func() { e.releaseAll(released) })
	measure("ClaimBatch of 5 duplicates and 5 live", func() {
		e.expectBatch(append(reqs[:5:5], req(e.key("live"), ""), req(e.key("live"), "")), append(outcomes(5, dedup.Duplicate), dedup.Acquired, dedup.InProgress)...)
	})
}

// TestBatchFences: a ClaimBatch gives every record it wins a fence, as a
// single claim does: larger than the fence of the key's earlier winners
// (a record released and claimed again with the next batch), and none to a
// record it does not win (the same key twice in one batch). Without
// Features.Fencing every fence is 0.
func TestBatchFences(t *testing.T, newStore Constructor, features Features) {
	e := newBatchEnv(t, "BatchFences", newStore, features)
	a, b := e.key("a"), e.key("b")
	req := func(key string) dedup.ClaimRequest {
		return dedup.ClaimRequest{Key: key, Lease: longLease}
	}
	first := e.expectBatch([]dedup.ClaimRequest{req(a), req(b), req(a)}, dedup.Acquired, dedup.Acquired, dedup.InProgress)
	if !e.features.Fencing {
		for i, r := range first {
			if r.Claim.Fence != 0 {
				t.Fatalf("record %d: fence %d from a store that does not declare Features.Fencing", i, r.Claim.Fence)
			}
		}
		return
	}
	if first[0].Claim.Fence == 0 || first[1].Claim.Fence == 0 {
		t.Fatalf("won records with fences %d and %d, want both set", first[0].Claim.Fence, first[1].Claim.Fence)
	}
	if first[2].Claim.Fence != 0 {
		t.Fatalf("the copy that found the record in progress carries fence %d", first[2].Claim.Fence)
	}
	for _, err := range e.bs.ReleaseBatch(e.ctx, []dedup.Claim{first[0].Claim, first[1].Claim}) {
		if err != nil {
			t.Fatalf("ReleaseBatch: %v", err)
		}
	}
	again := e.expectBatch([]dedup.ClaimRequest{req(a), req(b)}, dedup.Acquired, dedup.Acquired)
	for i := range again {
		if again[i].Claim.Fence <= first[i].Claim.Fence {
			t.Fatalf("record %d claimed again after its release: fence %d, not larger than %d", i, again[i].Claim.Fence, first[i].Claim.Fence)
		}
	}
}
