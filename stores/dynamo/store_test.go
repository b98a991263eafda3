package dynamo_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// testIDs gives every test invocation (including each -count repetition)
// keys of its own on the shared table.
var testIDs sync.Map // *testing.T → string

func testKey(t *testing.T, name string) string {
	id, _ := testIDs.LoadOrStore(t, storekit.NewToken()[:8])
	return "test-" + id.(string) + "-" + t.Name() + "-" + name
}

func mustClaim(t *testing.T, s dedup.Store, key, fingerprint string, lease time.Duration, want dedup.Outcome) dedup.ClaimResult {
	t.Helper()
	res, err := s.Claim(context.Background(), key, fingerprint, lease)
	if err != nil {
		t.Fatalf("Claim(%.40q): %v", key, err)
	}
	if res.Outcome != want {
		t.Fatalf("Claim(%.40q) = %v, want %v", key, res.Outcome, want)
	}
	return res
}

func mustComplete(t *testing.T, s dedup.Store, c dedup.Claim, result []byte, retention time.Duration) {
	t.Helper()
	if err := s.Complete(context.Background(), c, result, retention); err != nil {
		t.Fatalf("Complete(%.40q): %v", c.Key, err)
	}
}

// rawItem reads the item for key straight from the table.
func rawItem(t *testing.T, key string) map[string]types.AttributeValue {
	t.Helper()
	pk, err := dynamo.PartitionKey(key)
	if err != nil {
		t.Fatal(err)
	}
	out, err := client.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName:      aws.String(testTable),
		Key:            map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		t.Fatalf("GetItem: %v", err)
	}
	return out.Item
}

// The fallback: dynalite returns no old item, so a claim that finds a
// record costs one PutItem and one consistent GetItem, and a claim that
// finds none costs one PutItem.
func TestClaimFallsBackToGetItem(t *testing.T) {
	c := &hookClient{Client: client}
	s := newStore(t, dynamo.Config{Client: c})
	key := testKey(t, "k")
	claim := mustClaim(t, s, key, "", time.Minute, dedup.Acquired).Claim
	if p, u, g := c.puts.Load(), c.updates.Load(), c.gets.Load(); p != 1 || u != 0 || g != 0 {
		t.Fatalf("acquiring took %d PutItem, %d UpdateItem and %d GetItem, want 1, 0 and 0", p, u, g)
	}
	mustComplete(t, s, claim, []byte("r"), time.Hour)
	if res := mustClaim(t, s, key, "", time.Minute, dedup.Duplicate); string(res.Result) != "r" {
		t.Fatalf("result = %q, want r", res.Result)
	}
	if p, u, g := c.puts.Load(), c.updates.Load(), c.gets.Load(); p != 2 || u != 1 || g != 1 {
		t.Fatalf("after the duplicate: %d PutItem (claim, claim), %d UpdateItem (complete) and %d GetItem, want 2, 1 and 1", p, u, g)
	}
}

// A claim of a key without a record is one PutItem whose condition is
// attribute_not_exists(pk) alone, the cheapest conditional write; a
// released record costs that PutItem and the UpdateItem that takes it
// over, keeping its provenance (a count of 2). On a server that returns
// the old item (real DynamoDB, here the ALL_OLD wrapper) no GetItem is
// needed on either path.
func TestClaimOfANewKeyIsOnePutItem(t *testing.T) {
	inner := &allOldClient{Client: client, pk: dynamo.DefaultPartitionKey}
	c := &hookClient{Client: inner}
	var conditions []string
	c.afterPut = func(ctx context.Context, in *dynamodb.PutItemInput, out *dynamodb.PutItemOutput, err error) (*dynamodb.PutItemOutput, error) {
		for k, v := range in.ExpressionAttributeNames {
			conditions = append(conditions, strings.ReplaceAll(*in.ConditionExpression, k, v))
		}
		return out, err
	}
	s := newStore(t, dynamo.Config{Client: c})
	key := testKey(t, "k")
	claim := mustClaim(t, s, key, "", time.Minute, dedup.Acquired).Claim
	if p, u, g := c.puts.Load(), c.updates.Load(), c.gets.Load(); p != 1 || u != 0 || g != 0 {
		t.Fatalf("acquiring a new key took %d PutItem, %d UpdateItem and %d GetItem, want 1, 0 and 0", p, u, g)
	}
	if len(conditions) != 1 || conditions[0] != "attribute_not_exists (pk)" {
		t.Fatalf("the claim's PutItem conditions = %q, want [attribute_not_exists (pk)]", conditions)
	}
	if err := s.Release(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, key, "", time.Minute, dedup.Acquired)
	if p, u, g := c.puts.Load(), c.updates.Load(), c.gets.Load(); p != 2 || u != 2 || g != 0 {
		t.Fatalf("release and takeover: %d PutItem, %d UpdateItem and %d GetItem, want 2, 2 (release, takeover) and 0", p, u, g)
	}
	if rec, err := s.Inspect(context.Background(), key); err != nil || rec.Claims != 2 {
		t.Fatalf("Inspect: %+v %v, want 2 claims", rec, err)
	}
}

// The record is released between the failed PutItem and the fallback
// GetItem: the claim starts over and acquires, taking over the released
// record (a count of 2).
func TestClaimRetriesWhenRecordVanishes(t *testing.T) {
	key := testKey(t, "k")
	owner := newStore(t, dynamo.Config{})
	first := mustClaim(t, owner, key, "", time.Minute, dedup.Acquired).Claim

	c := &hookClient{Client: client}
	c.afterPut = func(ctx context.Context, in *dynamodb.PutItemInput, out *dynamodb.PutItemOutput, err error) (*dynamodb.PutItemOutput, error) {
		if c.puts.Load() == 1 {
			if rerr := owner.Release(ctx, first); rerr != nil {
				t.Errorf("Release between PutItem and GetItem: %v", rerr)
			}
		}
		return out, err
	}
	s := newStore(t, dynamo.Config{Client: c})
	mustClaim(t, s, key, "", time.Minute, dedup.Acquired)
	if p, u, g := c.puts.Load(), c.updates.Load(), c.gets.Load(); p != 1 || u != 1 || g != 1 {
		t.Fatalf("%d PutItem, %d UpdateItem and %d GetItem, want 1, 1 and 1", p, u, g)
	}
	if rec, err := s.Inspect(context.Background(), key); err != nil || rec.Claims != 2 {
		t.Fatalf("Inspect: %+v %v, want 2 claims", rec, err)
	}
}

// A server that keeps failing the condition while the record keeps
// disappearing: the claim gives up after a bounded number of attempts.
func TestClaimGivesUpWhenRecordKeepsChanging(t *testing.T) {
	key := testKey(t, "k")
	mustClaim(t, newStore(t, dynamo.Config{}), key, "", time.Minute, dedup.Acquired)
	c := &hookClient{Client: client}
	c.getItem = func(context.Context, *dynamodb.GetItemInput) (*dynamodb.GetItemOutput, error) {
		return &dynamodb.GetItemOutput{}, nil // "gone"
	}
	_, err := newStore(t, dynamo.Config{Client: c}).Claim(context.Background(), key, "", time.Minute)
	if !errors.Is(err, dynamo.ErrContended) {
		t.Fatalf("Claim = %v, want ErrContended", err)
	}
	if p := c.puts.Load(); p != 4 {
		t.Fatalf("%d PutItem attempts, want 4", p)
	}
}

// An SDK retry of a claim's write whose first attempt succeeded but whose
// response was lost finds the claim's own token: that is Acquired, not
// InProgress (which would block the key for a whole lease), and counts
// one claim.
func TestClaimRecognisesItsOwnRetriedPut(t *testing.T) {
	c := &hookClient{Client: client}
	c.afterPut = func(ctx context.Context, in *dynamodb.PutItemInput, out *dynamodb.PutItemOutput, err error) (*dynamodb.PutItemOutput, error) {
		if err != nil || in.ReturnValuesOnConditionCheckFailure == "" {
			return out, err
		}
		return c.Client.PutItem(ctx, in) // the "retry": fails its condition
	}
	s := newStore(t, dynamo.Config{Client: c})
	key := testKey(t, "k")
	claim := mustClaim(t, s, key, "", time.Minute, dedup.Acquired).Claim
	if got := rawItem(t, key)["token"].(*types.AttributeValueMemberS).Value; got != claim.Token {
		t.Fatalf("stored token %q, claim token %q", got, claim.Token)
	}
	if got := rawItem(t, key)["claims"].(*types.AttributeValueMemberN).Value; got != "1" {
		t.Fatalf("claims = %s after a retried claim, want 1", got)
	}
	c.afterPut = nil
	mustComplete(t, s, claim, nil, time.Hour)
}

// ClockSkewMargin: the owner loses the claim at the deadline, a contender
// may take over only once the deadline is more than the margin behind.
func TestClockSkewMargin(t *testing.T) {
	for _, tc := range []struct {
		name   string
		margin time.Duration
		want   time.Duration
	}{
		{"default", 0, dynamo.DefaultClockSkewMargin},
		{"explicit", 3 * time.Second, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clock := fakeclock.New(epoch)
			s := newStore(t, dynamo.Config{Clock: clock, ClockSkewMargin: tc.margin})
			key := testKey(t, "k")
			lease := 10 * time.Second
			owner := mustClaim(t, s, key, "", lease, dedup.Acquired).Claim

			clock.Advance(lease - time.Millisecond)
			if err := s.Extend(ctx, owner, lease); err != nil {
				t.Fatalf("Extend 1ms before the deadline: %v", err)
			}
			clock.Advance(lease)
			if err := s.Extend(ctx, owner, lease); !errors.Is(err, dedup.ErrClaimLost) {
				t.Fatalf("Extend at the deadline = %v, want ErrClaimLost", err)
			}
			mustClaim(t, s, key, "", lease, dedup.InProgress)
			clock.Advance(tc.want)
			mustClaim(t, s, key, "", lease, dedup.InProgress) // deadline + margin: not yet
			clock.Advance(time.Millisecond)
			mustClaim(t, s, key, "", lease, dedup.Acquired)
		})
	}
}

func TestItemLayout(t *testing.T) {
	clock := fakeclock.New(epoch)
	s := newStore(t, dynamo.Config{Clock: clock, ClockSkewMargin: 1500 * time.Millisecond})
	key := testKey(t, "k")
	origin := dedup.Origin{TransportID: "0b9f8e3c-4d1a-4e2b-9c3d-5e6f7a8b9c0d", MessageID: "73fca7ac-78e9-4ea4-a1bf-71a92e2fbda8"}
	res, err := s.Claim(dedup.WithOrigin(context.Background(), origin), key, "fp-1", 30*time.Second)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("Claim: %+v %v", res, err)
	}
	claim := res.Claim

	str := func(item map[string]types.AttributeValue, name string) string {
		t.Helper()
		v, ok := item[name].(*types.AttributeValueMemberS)
		if !ok {
			t.Fatalf("attribute %q = %#v, want a string", name, item[name])
		}
		return v.Value
	}
	num := func(item map[string]types.AttributeValue, name string) int64 {
		t.Helper()
		v, ok := item[name].(*types.AttributeValueMemberN)
		if !ok {
			t.Fatalf("attribute %q = %#v, want a number", name, item[name])
		}
		n, err := strconv.ParseInt(v.Value, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	item := rawItem(t, key)
	if len(item) != 11 {
		t.Fatalf("in-progress item has %d attributes, want 11: %v", len(item), item)
	}
	// The fence: the claim's, microseconds since the epoch by the store's
	// clock for a key without an item.
	if got := num(item, "fence"); got != epoch.UnixMicro() || uint64(got) != claim.Fence {
		t.Fatalf("fence = %d, claim's fence %d, want both %d", got, claim.Fence, epoch.UnixMicro())
	}
	deadline := epoch.Add(30 * time.Second).UnixMilli()
	if str(item, "pk") != key || str(item, "state") != "in_progress" || str(item, "token") != claim.Token ||
		str(item, "fingerprint") != "fp-1" || num(item, "deadline") != deadline {
		t.Fatalf("in-progress item = %v", item)
	}
	// Who and when, readable in the console as seed 003's table.
	claimedAt := epoch.UTC().Format("2006-01-02T15:04:05.000Z")
	if str(item, "claimed_at") != claimedAt || num(item, "claims") != 1 ||
		str(item, "transport_id") != origin.TransportID || str(item, "message_id") != origin.MessageID {
		t.Fatalf("in-progress item's provenance = %v, want claimed at %s", item, claimedAt)
	}
	// TTL: epoch seconds, rounded up, never before deadline + margin.
	if got, want := num(item, "ttl"), epoch.Add(32*time.Second).Unix(); got != want {
		t.Fatalf("ttl = %d, want %d", got, want)
	}

	clock.Advance(5 * time.Second)
	mustComplete(t, s, claim, []byte("out"), time.Hour)
	item = rawItem(t, key)
	expiry := epoch.Add(5*time.Second + time.Hour)
	if str(item, "state") != "completed" || num(item, "deadline") != expiry.UnixMilli() ||
		num(item, "ttl") != expiry.Add(2*time.Second).Unix() || str(item, "token") != claim.Token ||
		str(item, "completed_at") != epoch.Add(5*time.Second).UTC().Format("2006-01-02T15:04:05.000Z") ||
		str(item, "claimed_at") != claimedAt || num(item, "claims") != 1 || uint64(num(item, "fence")) != claim.Fence {
		t.Fatalf("completed item = %v", item)
	}
	if b, ok := item["result"].(*types.AttributeValueMemberB); !ok || string(b.Value) != "out" {
		t.Fatalf("result attribute = %#v, want binary \"out\"", item["result"])
	}
}

// An empty result is stored as no attribute at all; nil and empty are the
// same result.
func TestEmptyResultStoresNoAttribute(t *testing.T) {
	s := newStore(t, dynamo.Config{})
	key := testKey(t, "k")
	mustComplete(t, s, mustClaim(t, s, key, "", time.Minute, dedup.Acquired).Claim, []byte{}, time.Hour)
	if _, ok := rawItem(t, key)["result"]; ok {
		t.Fatalf("empty result stored as an attribute")
	}
	if res := mustClaim(t, s, key, "", time.Minute, dedup.Duplicate); res.Result != nil {
		t.Fatalf("Duplicate result = %q, want nil", res.Result)
	}
}

func TestLongKeysAndFingerprintsAreHashed(t *testing.T) {
	s := newStore(t, dynamo.Config{})
	long := testKey(t, strings.Repeat("x", 5000))
	longFP := strings.Repeat("f", 300)
	claim := mustClaim(t, s, long, longFP, time.Minute, dedup.Acquired).Claim
	item := rawItem(t, long)
	pk := item["pk"].(*types.AttributeValueMemberS).Value
	if want, _ := dynamo.PartitionKey(long); pk != want || len(pk) >= 2048 || !strings.HasPrefix(pk, long[:100]) {
		t.Fatalf("pk = %.60q… (%d bytes), want PartitionKey(key)", pk, len(pk))
	}
	fp := item["fingerprint"].(*types.AttributeValueMemberS).Value
	if len(fp) != 71 || !strings.HasPrefix(fp, "sha256:") {
		t.Fatalf("stored fingerprint = %q, want its sha256 digest", fp)
	}
	mustClaim(t, s, long, longFP, time.Minute, dedup.InProgress)
	mustClaim(t, s, long, longFP+"g", time.Minute, dedup.Conflict)
	mustClaim(t, s, long, strings.Repeat("f", 64), time.Minute, dedup.Conflict)
	mustComplete(t, s, claim, nil, time.Hour)

	// A fingerprint that is not valid UTF-8 is hashed too, so that distinct
	// byte strings are not merged by the JSON protocol.
	other := testKey(t, "bad-utf8-fp")
	mustClaim(t, s, other, "\xff", time.Minute, dedup.Acquired)
	mustClaim(t, s, other, "\xfe", time.Minute, dedup.Conflict)
	mustClaim(t, s, other, "\xff", time.Minute, dedup.InProgress)
}

// MaxResultSize leaves room for the longest partition key and fingerprint
// in DynamoDB's 400 KB item; long attribute names leave less. That results
// up to it are stored and one byte more is refused with ErrResultTooLarge
// is storetest's TestResultTooLarge (TestConformance).
func TestMaxResultSize(t *testing.T) {
	if got := newStore(t, dynamo.Config{}).MaxResultSize(); got != 408472 {
		t.Fatalf("MaxResultSize with default names = %d, want 408472", got)
	}
	named := newStore(t, dynamo.Config{Attributes: dynamo.AttributeNames{Result: strings.Repeat("r", 200)}})
	if got := named.MaxResultSize(); got != 408472-194 {
		t.Fatalf("MaxResultSize with a 200-byte result name = %d, want %d", got, 408472-194)
	}
}

// Complete, Release and Extend with a token that does not own the record:
// ErrClaimLost, with the SDK's exception kept for errors.As.
func TestClaimLostKeepsTheCause(t *testing.T) {
	s := newStore(t, dynamo.Config{})
	key := testKey(t, "k")
	mustClaim(t, s, key, "", time.Minute, dedup.Acquired)
	stale := dedup.Claim{Key: key, Token: storekit.NewToken()}
	for name, err := range map[string]error{
		"Complete": s.Complete(context.Background(), stale, nil, time.Hour),
		"Release":  s.Release(context.Background(), stale),
		"Extend":   s.Extend(context.Background(), stale, time.Minute),
	} {
		var failed *types.ConditionalCheckFailedException
		if !errors.Is(err, dedup.ErrClaimLost) || !errors.As(err, &failed) {
			t.Errorf("%s = %v, want ErrClaimLost wrapping *types.ConditionalCheckFailedException", name, err)
		}
	}
}

// Transport failures are not ErrClaimLost: the caller cannot know whether
// the write happened. The SDK's error stays reachable with errors.As.
func TestUnreachableServerKeepsTheCause(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close() // nothing listens there now
	s := newStore(t, dynamo.Config{Client: newClient("http://"+addr, 1), SkipTableCheck: true})
	ctx := context.Background()
	claim := dedup.Claim{Key: "k", Token: storekit.NewToken()}
	_, claimErr := s.Claim(ctx, "k", "", time.Minute)
	for name, err := range map[string]error{
		"Claim":    claimErr,
		"Complete": s.Complete(ctx, claim, nil, time.Hour),
		"Release":  s.Release(ctx, claim),
		"Extend":   s.Extend(ctx, claim, time.Minute),
	} {
		var opErr *smithy.OperationError
		var netErr *net.OpError
		if err == nil || errors.Is(err, dedup.ErrClaimLost) || !errors.As(err, &opErr) || !errors.As(err, &netErr) {
			t.Errorf("%s = %v, want a *smithy.OperationError wrapping a *net.OpError, not ErrClaimLost", name, err)
		}
	}
}

// An item this store did not write is neither overwritten nor guessed at.
func TestMalformedRecordIsReported(t *testing.T) {
	s := newStore(t, dynamo.Config{})
	for name, item := range map[string]map[string]types.AttributeValue{
		"unknown-state":   {"state": &types.AttributeValueMemberS{Value: "weird"}, "token": &types.AttributeValueMemberS{Value: "t"}, "deadline": &types.AttributeValueMemberN{Value: "99999999999999"}},
		"no-deadline":     {"state": &types.AttributeValueMemberS{Value: "completed"}, "token": &types.AttributeValueMemberS{Value: "t"}},
		"string-deadline": {"state": &types.AttributeValueMemberS{Value: "completed"}, "token": &types.AttributeValueMemberS{Value: "t"}, "deadline": &types.AttributeValueMemberS{Value: "0"}},
	} {
		key := testKey(t, name)
		item["pk"] = &types.AttributeValueMemberS{Value: key}
		if _, err := client.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(testTable), Item: item}); err != nil {
			t.Fatal(err)
		}
		_, err := s.Claim(context.Background(), key, "", time.Minute)
		if !errors.Is(err, dynamo.ErrMalformedRecord) {
			t.Errorf("%s: Claim = %v, want ErrMalformedRecord", name, err)
		}
		if got := rawItem(t, key); got["token"].(*types.AttributeValueMemberS).Value != "t" {
			t.Errorf("%s: the item was overwritten", name)
		}
	}
}

func TestInvalidKeysRefused(t *testing.T) {
	s := newStore(t, dynamo.Config{})
	for _, key := range []string{"", "bad-\xff-utf8"} {
		if _, err := s.Claim(context.Background(), key, "", time.Minute); !errors.Is(err, dynamo.ErrInvalidKey) {
			t.Errorf("Claim(%q) = %v, want ErrInvalidKey", key, err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	if err := (dynamo.Config{Client: client, Table: "t"}).Validate(); err != nil {
		t.Fatalf("minimal config: %v", err)
	}
	err := dynamo.Config{
		ClockSkewMargin: -time.Second,
		Attributes:      dynamo.AttributeNames{State: "pk"},
	}.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, want := range []string{"Client is required", "Table is required", "ClockSkewMargin", `"pk" is used twice`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error lacks %q: %v", want, err)
		}
	}
	if !errors.Is(err, dedup.ErrInvalidDuration) {
		t.Errorf("negative margin: %v does not match ErrInvalidDuration", err)
	}
	if _, nerr := dynamo.New(context.Background(), dynamo.Config{}); nerr == nil {
		t.Error("New accepted an empty config")
	}
}

// A Config without a client is refused at New with ErrNoClient, before any
// request, whether the client is nil or a nil *dynamodb.Client.
func TestNewNilClient(t *testing.T) {
	var nilClient *dynamodb.Client
	for name, config := range map[string]dynamo.Config{
		"nil":                  {Table: "t"},
		"nil *dynamodb.Client": {Client: nilClient, Table: "t"},
		"with other errors":    {},
	} {
		store, err := dynamo.New(context.Background(), config)
		if !errors.Is(err, dynamo.ErrNoClient) || store != nil {
			t.Errorf("%s: New = %v, %v; want ErrNoClient", name, store, err)
		}
		if err := config.Validate(); !errors.Is(err, dynamo.ErrNoClient) {
			t.Errorf("%s: Validate = %v; want ErrNoClient", name, err)
		}
	}
}

// An item claimed by the previous version (no who-and-when attributes) and
// completed by this one: Inspect shows neither a claimed-at nor a
// completed-at, as admin.Record promises (CompletedAt is zero where
// ClaimedAt is), instead of a completion time without a claim time.
func TestItemOfThePreviousVersionHasNoCompletedAt(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, dynamo.Config{Clock: fakeclock.New(epoch)})
	key := testKey(t, "k")
	res := mustClaim(t, s, key, "", time.Minute, dedup.Acquired)
	pk, err := dynamo.PartitionKey(key)
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:        aws.String(testTable),
		Key:              map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}},
		UpdateExpression: aws.String("REMOVE claimed_at, claims, transport_id, message_id"),
	})
	if err != nil {
		t.Fatal(err)
	}
	mustComplete(t, s, res.Claim, nil, time.Hour)
	r, err := s.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !r.ClaimedAt.IsZero() || !r.CompletedAt.IsZero() || r.Claims != 0 {
		t.Errorf("record of an item without who-and-when: claimed at %v, completed at %v, claims %d; want all zero", r.ClaimedAt, r.CompletedAt, r.Claims)
	}
}

// previousLayout is an item as the version before fencing wrote it: every
// attribute but the fence, and one this version does not know (as the
// fence is to the previous version), which must be ignored.
func previousLayout(t *testing.T, key, state string, deadline time.Time) map[string]types.AttributeValue {
	t.Helper()
	pk, err := dynamo.PartitionKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]types.AttributeValue{
		"pk":         &types.AttributeValueMemberS{Value: pk},
		"state":      &types.AttributeValueMemberS{Value: state},
		"token":      &types.AttributeValueMemberS{Value: storekit.NewToken()},
		"deadline":   &types.AttributeValueMemberN{Value: strconv.FormatInt(deadline.UnixMilli(), 10)},
		"ttl":        &types.AttributeValueMemberN{Value: strconv.FormatInt(deadline.Add(2*time.Second).Unix(), 10)},
		"claimed_at": &types.AttributeValueMemberS{Value: epoch.Add(-time.Hour).UTC().Format("2006-01-02T15:04:05.000Z")},
		"claims":     &types.AttributeValueMemberN{Value: "1"},
		"x_future":   &types.AttributeValueMemberS{Value: "an attribute of a later version"},
	}
}

// Items written before fencing, without a fence attribute, keep working:
// they read as fence 0, so a live one answers as before and one no longer
// live is taken over (UpdateItem) or started afresh (PutItem) under the
// fence condition's attribute_not_exists branch, with a fence from the
// clock; an attribute the store does not know is ignored, as the previous
// version ignores the fence.
func TestItemOfThePreviousLayoutHasFenceZero(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(epoch)
	s := newStore(t, dynamo.Config{Clock: clock})
	put := func(item map[string]types.AttributeValue) {
		t.Helper()
		if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(testTable), Item: item}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, state string
		deadline    time.Time
		want        dedup.Outcome
	}{
		{"live in progress", "in_progress", epoch.Add(time.Minute), dedup.InProgress},
		{"live completed", "completed", epoch.Add(time.Hour), dedup.Duplicate},
		{"released", "released", time.UnixMilli(0), dedup.Acquired},
		{"lease ended", "in_progress", epoch.Add(-time.Minute), dedup.Acquired},
		{"retention passed", "completed", epoch.Add(-time.Minute), dedup.Acquired},
	} {
		key := testKey(t, tc.name)
		put(previousLayout(t, key, tc.state, tc.deadline))
		if tc.state == "in_progress" && tc.want == dedup.InProgress {
			if r, err := s.Inspect(ctx, key); err != nil || r.Claims != 1 {
				t.Errorf("%s: Inspect = %+v, %v", tc.name, r, err)
			}
		}
		res := mustClaim(t, s, key, "", time.Minute, tc.want)
		if tc.want != dedup.Acquired {
			continue
		}
		if res.Claim.Fence != uint64(epoch.UnixMicro()) {
			t.Errorf("%s: fence %d, want the clock's %d (the item had none)", tc.name, res.Claim.Fence, epoch.UnixMicro())
		}
		if got := rawItem(t, key)["fence"]; got == nil || got.(*types.AttributeValueMemberN).Value != strconv.FormatUint(res.Claim.Fence, 10) {
			t.Errorf("%s: stored fence %v, want %d", tc.name, got, res.Claim.Fence)
		}
		mustComplete(t, s, res.Claim, nil, time.Hour)
	}
}

// A takeover computed from an item read before another claim took the
// item over and released it again never lowers the fence that claim
// wrote: its condition requires the stored fence to be below the new one,
// so it fails, the claim reads the item again and writes a fence above
// the other claim's. Both takeover writes: the UpdateItem of a released
// item, the PutItem after a completed item's retention. The other claim's
// clock runs ahead, so without the condition the stale write's fence
// would be no larger than the other claim's.
func TestTakeoverNeverLowersTheFence(t *testing.T) {
	for _, tc := range []struct {
		name string
		// behind is the stale claimer's clock; the item's first claim
		// runs at epoch+1s, the other claim at epoch+11s.
		behind        time.Duration
		completed     bool
		puts, updates int64
	}{
		// PutItem (fails), the stale UpdateItem (refused), UpdateItem.
		{name: "released", behind: 0, puts: 1, updates: 2},
		// PutItem (fails), the stale PutItem (refused), UpdateItem: the
		// item is released by then.
		{name: "retention passed", behind: 5 * time.Second, completed: true, puts: 2, updates: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			key := testKey(t, "k")
			aheadClock := fakeclock.New(epoch.Add(time.Second))
			ahead := newStore(t, dynamo.Config{Clock: aheadClock})
			first := mustClaim(t, ahead, key, "", time.Minute, dedup.Acquired).Claim
			if tc.completed {
				mustComplete(t, ahead, first, nil, time.Millisecond)
			} else if err := ahead.Release(ctx, first); err != nil {
				t.Fatal(err)
			}
			aheadClock.Advance(10 * time.Second)

			var other dedup.Claim
			c := &hookClient{Client: client}
			c.getItem = func(ctx context.Context, in *dynamodb.GetItemInput) (*dynamodb.GetItemOutput, error) {
				out, err := client.GetItem(ctx, in)
				if c.gets.Load() == 1 { // the item is read: another claim wins it and releases it
					other = mustClaim(t, ahead, key, "", time.Minute, dedup.Acquired).Claim
					if rerr := ahead.Release(ctx, other); rerr != nil {
						t.Error(rerr)
					}
				}
				return out, err
			}
			behind := newStore(t, dynamo.Config{Client: c, Clock: fakeclock.New(epoch.Add(tc.behind))})
			res := mustClaim(t, behind, key, "", time.Minute, dedup.Acquired)
			if other.Fence <= first.Fence {
				t.Fatalf("the other claim's fence %d is not above the first's %d", other.Fence, first.Fence)
			}
			if res.Claim.Fence <= other.Fence {
				t.Fatalf("the stale takeover took fence %d, not above the fence %d of the claim that won meanwhile", res.Claim.Fence, other.Fence)
			}
			if p, u := c.puts.Load(), c.updates.Load(); p != tc.puts || u != tc.updates {
				t.Errorf("%d PutItem and %d UpdateItem calls, want %d and %d", p, u, tc.puts, tc.updates)
			}
		})
	}
}

// A Complete whose condition fails is checked against the record: was it
// this claim's own earlier attempt, whose response was lost? On a server
// that does not return the old item with the failure (dynalite) the
// check is a GetItem; when that read fails too, the error is not
// ErrClaimLost (the record may well be completed by this claim), so the
// engine sends the completion again, and the next attempt, able to read,
// finds ErrAlreadyCompleted. The linearizability check of dynalite behind
// a dropping proxy found "claim lost" answered for a completed record.
func TestCompleteWhoseCheckCannotReadIsNotClaimLost(t *testing.T) {
	c := &hookClient{Client: client}
	s := newStore(t, dynamo.Config{Client: c})
	ctx := context.Background()
	key := testKey(t, "k")
	claim := mustClaim(t, s, key, "", time.Minute, dedup.Acquired).Claim

	lost := errors.New("response lost (injected)")
	c.afterUpdate = func(_ context.Context, _ *dynamodb.UpdateItemInput, out *dynamodb.UpdateItemOutput, err error) (*dynamodb.UpdateItemOutput, error) {
		c.afterUpdate = nil
		if err != nil {
			t.Errorf("the first completion failed on the server: %v", err)
		}
		return nil, lost
	}
	if err := s.Complete(ctx, claim, []byte("r"), time.Hour); !errors.Is(err, lost) || errors.Is(err, dedup.ErrClaimLost) {
		t.Fatalf("Complete whose response was lost = %v, want the transport's error", err)
	}

	c.getItem = func(context.Context, *dynamodb.GetItemInput) (*dynamodb.GetItemOutput, error) {
		return nil, errors.New("connection reset (injected)")
	}
	err := s.Complete(ctx, claim, []byte("r"), time.Hour)
	if err == nil || errors.Is(err, dedup.ErrClaimLost) || errors.Is(err, dedup.ErrAlreadyCompleted) {
		t.Fatalf("resent Complete whose check could not read = %v, want an error that is neither ErrClaimLost nor ErrAlreadyCompleted", err)
	}

	c.getItem = nil
	if err := s.Complete(ctx, claim, []byte("r"), time.Hour); !errors.Is(err, dedup.ErrAlreadyCompleted) {
		t.Fatalf("resent Complete that can read = %v, want ErrAlreadyCompleted", err)
	}
	if res := mustClaim(t, s, key, "", time.Minute, dedup.Duplicate); string(res.Result) != "r" {
		t.Fatalf("the record's result = %q, want r", res.Result)
	}
}
