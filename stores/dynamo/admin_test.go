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
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
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

// What only DynamoDB shows: an item this store did not write is refused by
// Inspect (ErrMalformedRecord), deleted and reported by Evict, and listed
// as unreadable; an expired item stays in the table (Inspect: not found)
// until Evict deletes it; a long fingerprint is shown as its digest; List
// needs a client with Scan. The rest of the admin contract is
// storetest.RunAdmin (TestAdmin).
func TestAdminDynamoItems(t *testing.T) {
	ctx := context.Background()
	clock := fakeclock.New(epoch)
	store := newStore(t, dynamo.Config{Clock: clock})

	bad := testKey(t, "malformed")
	putRaw(t, testTable, bad)
	if _, err := store.Inspect(ctx, bad); !errors.Is(err, dynamo.ErrMalformedRecord) {
		t.Errorf("Inspect malformed: %v, want ErrMalformedRecord", err)
	}
	recs, next, err := store.List(ctx, bad, "", 10)
	if err != nil || next != "" || len(recs) != 1 || recs[0].State != admin.StateUnreadable || recs[0].Key != bad || recs[0].Problem == "" {
		t.Errorf("List malformed = %+v, %q, %v", recs, next, err)
	}
	if ok, err := store.Evict(ctx, bad); !ok || err != nil || rawItem(t, bad) != nil {
		t.Errorf("Evict malformed = %v, %v; want true, and the item gone", ok, err)
	}
	if _, err := store.Inspect(ctx, ""); !errors.Is(err, dynamo.ErrInvalidKey) {
		t.Errorf("Inspect empty key: %v, want ErrInvalidKey", err)
	}

	done := testKey(t, "done")
	res := mustClaim(t, store, done, strings.Repeat("f", 100), time.Minute, dedup.Acquired)
	mustComplete(t, store, res.Claim, []byte("12345"), time.Hour)
	if got, err := store.Inspect(ctx, done); err != nil || !strings.HasPrefix(got.Fingerprint, "sha256:") {
		t.Errorf("Inspect with a 100-byte fingerprint = %+v, %v; want its sha256 digest", got, err)
	}

	// Past its lease the item is still in the table but no longer a record.
	held := testKey(t, "held")
	mustClaim(t, store, held, "", time.Minute, dedup.Acquired)
	clock.Advance(2 * time.Minute)
	if _, err := store.Inspect(ctx, held); !errors.Is(err, admin.ErrNotFound) {
		t.Errorf("Inspect expired: %v, want ErrNotFound", err)
	}
	if rawItem(t, held) == nil {
		t.Fatal("the expired item is gone: the test expects it to stay until deleted")
	}
	if ok, err := store.Evict(ctx, held); ok || err != nil || rawItem(t, held) != nil {
		t.Errorf("Evict expired = %v, %v; want false, and the leftover item deleted", ok, err)
	}

	noScan := newStore(t, dynamo.Config{Client: noScanClient{client}})
	if _, _, err := noScan.List(ctx, admin.ScopePrefix("charge"), "", 3); !errors.Is(err, dynamo.ErrScanUnsupported) {
		t.Errorf("List without Scan: %v, want ErrScanUnsupported", err)
	}
}

type noScanClient struct{ dynamo.Client }

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

// listAll pages through List and returns the keys (sorted) and the number
// of pages; it checks the pages' sizes.
func listAll(t *testing.T, a admin.Interface, prefix string, limit int) ([]string, int) {
	t.Helper()
	var keys []string
	cursor := ""
	for pages := 1; pages <= 10_000; pages++ {
		recs, next, err := a.List(context.Background(), prefix, cursor, limit)
		if err != nil {
			t.Fatalf("List page %d: %v", pages, err)
		}
		if len(recs) > limit {
			t.Fatalf("List page %d has %d records, limit %d", pages, len(recs), limit)
		}
		for _, r := range recs {
			keys = append(keys, r.Key)
		}
		if next == "" {
			sort.Strings(keys)
			return keys, pages
		}
		cursor = next
	}
	t.Fatal("List does not end")
	return nil, 0
}
