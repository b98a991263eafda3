package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/storekit"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// putRaw writes an item that this store did not write under pk.
func putRaw(t *testing.T, table, pk string) {
	t.Helper()
	_, err := client.PutItem(context.Background(), &dynamodb.PutItemInput{
		TableName: aws.String(table),
		Item: map[string]types.AttributeValue{
			"pk":    &types.AttributeValueMemberS{Value: pk},
			"state": &types.AttributeValueMemberS{Value: "weird"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestAdminInspect(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(epoch)
	store := newStore(t, dynamo.Config{Clock: clock})

	held, done := testKey(t, "held"), testKey(t, "done")
	long := testKey(t, strings.Repeat("x", 700))
	longFP := strings.Repeat("f", 100)
	mustClaim(t, store, held, "fp-1", time.Minute, dedup.Acquired)
	res := mustClaim(t, store, done, longFP, time.Minute, dedup.Acquired)
	mustComplete(t, store, res.Claim, []byte("12345"), time.Hour)
	mustClaim(t, store, long, "", time.Minute, dedup.Acquired)
	clock.Advance(10 * time.Second)

	got, err := store.Inspect(ctx, held)
	want := admin.Record{Key: held, State: admin.StateInProgress, Fingerprint: "fp-1", Remaining: 50 * time.Second}
	if err != nil || got != want {
		t.Errorf("Inspect in progress = %+v, %v; want %+v", got, err, want)
	}
	got, err = store.Inspect(ctx, done)
	if err != nil || got.State != admin.StateCompleted || got.ResultSize != 5 || got.Remaining != time.Hour-10*time.Second ||
		!strings.HasPrefix(got.Fingerprint, "sha256:") || !got.Created.IsZero() {
		t.Errorf("Inspect completed = %+v, %v", got, err)
	}
	// A long key is found under its hashed partition key.
	if got, err := store.Inspect(ctx, long); err != nil || got.Key != long || got.State != admin.StateInProgress {
		t.Errorf("Inspect long key = %+v, %v", got, err)
	}
	if _, err := store.Inspect(ctx, testKey(t, "missing")); !errors.Is(err, admin.ErrNotFound) {
		t.Errorf("Inspect missing: %v, want ErrNotFound", err)
	}
	bad := testKey(t, "malformed")
	putRaw(t, testTable, bad)
	if _, err := store.Inspect(ctx, bad); !errors.Is(err, dynamo.ErrMalformedRecord) {
		t.Errorf("Inspect malformed: %v, want ErrMalformedRecord", err)
	}

	// Past its lease the item is still in the table but no longer a record.
	clock.Advance(50 * time.Second)
	if _, err := store.Inspect(ctx, held); !errors.Is(err, admin.ErrNotFound) {
		t.Errorf("Inspect expired: %v, want ErrNotFound", err)
	}
	if rawItem(t, held) == nil {
		t.Fatal("the expired item is gone: the test expects it to stay until deleted")
	}
	if _, err := store.Inspect(ctx, ""); !errors.Is(err, dynamo.ErrInvalidKey) {
		t.Errorf("Inspect empty key: %v, want ErrInvalidKey", err)
	}
}

func TestAdminEvict(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(epoch)
	store := newStore(t, dynamo.Config{Clock: clock})

	held := mustClaim(t, store, testKey(t, "held"), "", time.Minute, dedup.Acquired).Claim
	long := testKey(t, strings.Repeat("y", 700))
	mustClaim(t, store, long, "", time.Minute, dedup.Acquired)
	for _, key := range []string{held.Key, long} {
		if ok, err := store.Evict(ctx, key); !ok || err != nil {
			t.Fatalf("Evict %.40q = %v, %v; want true", key, ok, err)
		}
		if rawItem(t, key) != nil {
			t.Fatalf("Evict %.40q left the item", key)
		}
		if ok, err := store.Evict(ctx, key); ok || err != nil {
			t.Fatalf("second Evict %.40q = %v, %v; want false", key, ok, err)
		}
	}
	if err := store.Complete(ctx, held, nil, time.Hour); !errors.Is(err, dedup.ErrClaimLost) {
		t.Errorf("Complete of an evicted claim: %v, want ErrClaimLost", err)
	}
	mustClaim(t, store, held.Key, "", time.Minute, dedup.Acquired)

	// An expired item is deleted, but reported as no record.
	old := testKey(t, "old")
	mustClaim(t, store, old, "", time.Second, dedup.Acquired)
	clock.Advance(2 * time.Second)
	if ok, err := store.Evict(ctx, old); ok || err != nil {
		t.Errorf("Evict expired = %v, %v; want false", ok, err)
	}
	if rawItem(t, old) != nil {
		t.Error("Evict left the expired item")
	}
	// An item of another program is deleted and reported.
	bad := testKey(t, "malformed")
	putRaw(t, testTable, bad)
	if ok, err := store.Evict(ctx, bad); !ok || err != nil {
		t.Errorf("Evict malformed = %v, %v; want true", ok, err)
	}
}

// listAll pages through List and returns the keys (sorted) and the number
// of pages; it checks the pages' sizes and records.
func listAll(t *testing.T, a admin.Interface, prefix string, limit int) ([]string, int) {
	t.Helper()
	var keys []string
	cursor := ""
	for pages := 1; ; pages++ {
		if pages > 10_000 {
			t.Fatal("List does not end")
		}
		recs, next, err := a.List(context.Background(), prefix, cursor, limit)
		if err != nil {
			t.Fatalf("List page %d: %v", pages, err)
		}
		if len(recs) > limit {
			t.Fatalf("List page %d has %d records, limit %d", pages, len(recs), limit)
		}
		for _, r := range recs {
			if !strings.HasPrefix(r.Key, prefix) {
				t.Errorf("List(%q) gave %q", prefix, r.Key)
			}
			if r.State != admin.StateUnreadable && (r.Remaining <= 0 || r.State != admin.StateCompleted && r.State != admin.StateInProgress) {
				t.Errorf("List record %+v", r)
			}
			keys = append(keys, r.Key)
		}
		if next == "" {
			sort.Strings(keys)
			return keys, pages
		}
		cursor = next
	}
}

type noScanClient struct{ dynamo.Client }

func TestAdminList(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(epoch)
	store := newStore(t, dynamo.Config{Clock: clock})
	base := testKey(t, "")
	scope := base + "charge"

	var want []string
	for i := range 23 {
		key := admin.ScopedKey(scope, fmt.Sprintf("ORDER-%02d", i))
		res := mustClaim(t, store, key, "", time.Minute, dedup.Acquired)
		if i%2 == 0 {
			mustComplete(t, store, res.Claim, []byte("r"), time.Hour)
		}
		want = append(want, key)
	}
	longKey := admin.ScopedKey(scope, strings.Repeat("z", 600))
	mustClaim(t, store, longKey, "", time.Minute, dedup.Acquired)
	longPK, err := dynamo.PartitionKey(longKey)
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, longPK) // List shows the partition key
	sort.Strings(want)
	mustClaim(t, store, admin.ScopedKey(scope+":eu", "ORDER-00"), "", time.Minute, dedup.Acquired) // another scope
	mustClaim(t, store, admin.ScopedKey(scope, "short-lived"), "", time.Second, dedup.Acquired)
	clock.Advance(2 * time.Second) // short-lived expires, the others have 58s or more left

	prefix := admin.ScopePrefix(scope)
	for _, limit := range []int{1, 7, 24, 1000} {
		got, _ := listAll(t, store, prefix, limit)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("limit %d: List = %q, want %q", limit, got, want)
		}
	}
	// Everything in the (shared) table includes this test's records.
	all, _ := listAll(t, store, "", 1000)
	n := 0
	for _, k := range all {
		if strings.HasPrefix(k, base) {
			n++
		}
	}
	if n != len(want)+1 {
		t.Errorf("List everything: %d of this test's records, want %d", n, len(want)+1)
	}

	bad := prefix + "malformed"
	putRaw(t, testTable, bad)
	recs, next, err := store.List(ctx, bad, "", 10)
	if err != nil || next != "" || len(recs) != 1 || recs[0].State != admin.StateUnreadable || recs[0].Key != bad || recs[0].Problem == "" {
		t.Errorf("List malformed = %+v, %q, %v", recs, next, err)
	}

	_, cursor, err := store.List(ctx, prefix, "", 3)
	if err != nil || cursor == "" {
		t.Fatalf("first page: %q, %v", cursor, err)
	}
	if _, _, err := store.List(ctx, "another:", cursor, 3); !errors.Is(err, admin.ErrInvalidCursor) {
		t.Errorf("cursor of another prefix: %v, want ErrInvalidCursor", err)
	}
	if _, _, err := store.List(ctx, prefix, "garbage!", 3); !errors.Is(err, admin.ErrInvalidCursor) {
		t.Errorf("garbage cursor: %v, want ErrInvalidCursor", err)
	}
	noScan := newStore(t, dynamo.Config{Client: noScanClient{client}})
	if _, _, err := noScan.List(ctx, prefix, "", 3); !errors.Is(err, dynamo.ErrScanUnsupported) {
		t.Errorf("List without Scan: %v, want ErrScanUnsupported", err)
	}
}

// A rare prefix in a table of many other items: pages may be short or
// empty, and the listing still finds every record once.
func TestAdminListSparse(t *testing.T) {
	ctx := context.Background()
	table := "admin_sparse_" + storekit.NewToken()[:8]
	if err := dynamo.CreateTable(ctx, client, dynamo.TableConfig{Table: table, SkipTTL: true}); err != nil {
		t.Fatal(err)
	}
	store := newStore(t, dynamo.Config{Table: table})
	for batch := range 80 {
		var reqs []types.WriteRequest
		for i := range 25 {
			reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: map[string]types.AttributeValue{
				"pk": &types.AttributeValueMemberS{Value: fmt.Sprintf("unrelated:%d", batch*25+i)},
			}}})
		}
		out, err := client.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{table: reqs}})
		if err != nil || len(out.UnprocessedItems) > 0 {
			t.Fatalf("BatchWriteItem: %v (%d unprocessed)", err, len(out.UnprocessedItems))
		}
	}
	var want []string
	for i := range 3 {
		key := admin.ScopedKey("rare", fmt.Sprint(i))
		mustClaim(t, store, key, "", time.Hour, dedup.Acquired)
		want = append(want, key)
	}
	got, pages := listAll(t, store, admin.ScopePrefix("rare"), 2)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("List = %q, want %q", got, want)
	}
	t.Logf("3 records among 2000 items in %d pages", pages)
	// The unrelated items are not records: listed as unreadable.
	recs, _, err := store.List(ctx, "unrelated:", "", 5)
	if err != nil || len(recs) == 0 || recs[0].State != admin.StateUnreadable {
		t.Errorf("List unrelated = %+v, %v", recs, err)
	}
}
