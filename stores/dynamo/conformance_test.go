package dynamo_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/dedup/storetest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// features of the store with the default attribute names: a fake clock per
// case, DynamoDB's 400 KB item limit, the operator's view, fences.
func features(t *testing.T) storetest.Features {
	return featuresOf(t, dynamo.AttributeNames{})
}

// featuresOf is features for a store with the attribute names attrs.
func featuresOf(t *testing.T, attrs dynamo.AttributeNames) storetest.Features {
	return storetest.Features{
		ControllableClock: true,
		MaxResultSize:     newStore(t, dynamo.Config{Attributes: attrs, SkipTableCheck: true}).MaxResultSize(),
		Admin:             true,
		AlreadyCompleted:  true,
		Provenance:        true,
		CountsTakeovers:   true,
		Fencing:           true,
		ListedKey: func(key string) string {
			pk, err := dynamo.PartitionKey(key)
			if err != nil {
				t.Errorf("PartitionKey(%.40q): %v", key, err)
			}
			return pk
		},
		// As stored: verbatim up to 64 bytes of UTF-8, else its digest.
		AdminFingerprint: func(fp string) string {
			if len(fp) <= 64 && utf8.ValidString(fp) {
				return fp
			}
			sum := sha256.Sum256([]byte(fp))
			return "sha256:" + hex.EncodeToString(sum[:])
		},
	}
}

// countingClient counts the requests the store sends through it, Scan
// included (storetest.RequestCounter).
type countingClient struct {
	dynamo.Client
	n atomic.Int64
}

func (c *countingClient) PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	c.n.Add(1)
	return c.Client.PutItem(ctx, in, opts...)
}

func (c *countingClient) GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	c.n.Add(1)
	return c.Client.GetItem(ctx, in, opts...)
}

func (c *countingClient) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	c.n.Add(1)
	return c.Client.UpdateItem(ctx, in, opts...)
}

func (c *countingClient) DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	c.n.Add(1)
	return c.Client.DeleteItem(ctx, in, opts...)
}

func (c *countingClient) Scan(ctx context.Context, in *dynamodb.ScanInput, opts ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error) {
	s, ok := c.Client.(dynamo.ScanClient)
	if !ok {
		return nil, dynamo.ErrScanUnsupported
	}
	c.n.Add(1)
	return s.Scan(ctx, in, opts...)
}

type requestCounter struct{ c *countingClient }

func (r requestCounter) Requests() int64 { return r.c.n.Load() }

// perCase returns a constructor that gives each case a store of its own on
// a fake clock, through a counting client around c. The skew margin is
// below the suite's ShortDuration (100ms), which it waits twice over.
// Without withAdmin the store is passed without its admin methods.
func perCase(c dynamo.Client, table string, withAdmin bool) storetest.Constructor {
	return perCaseOf(dynamo.Config{Client: c, Table: table}, withAdmin)
}

// perCaseOf is perCase for a store configured as base (Client, Table,
// Attributes).
func perCaseOf(base dynamo.Config, withAdmin bool) storetest.Constructor {
	return func(t *testing.T) (dedup.Store, func(time.Duration)) {
		clock := fakeclock.New(epoch)
		cc := &countingClient{Client: base.Client}
		config := base
		config.Client, config.Clock, config.ClockSkewMargin = cc, clock, 40*time.Millisecond
		s := newStore(t, config)
		if withAdmin {
			return struct {
				*dynamo.Store
				requestCounter
			}{s, requestCounter{cc}}, clock.Advance
		}
		return struct {
			dedup.Store
			requestCounter
		}{s, requestCounter{cc}}, clock.Advance
	}
}

// The suite on dynalite, which ignores ReturnValuesOnConditionCheckFailure:
// every claim that finds a record takes the GetItem fallback, so a claim is
// not one request (TestConformanceWithOldItemReturned and the moto run
// cover that path).
func TestConformance(t *testing.T) {
	storetest.Run(t, perCase(client, testTable, true), features(t))
}

func TestAdmin(t *testing.T)  { storetest.RunAdmin(t, perCase(client, testTable, true), features(t)) }
func TestRouter(t *testing.T) { storetest.RunRouter(t, perCase(client, testTable, true), features(t)) }

// customAttributes names every attribute otherwise, as a table shared with
// another schema might: the suite and the batch cases run on it too
// (TestConformanceCustomAttributes, TestBatchConformanceCustomAttributes).
var customAttributes = dynamo.AttributeNames{
	PartitionKey: "id", State: "st", Token: "owner", Fingerprint: "fp", Deadline: "until",
	Result: "out", TTL: "expires_at", ClaimedAt: "first_claim", CompletedAt: "done_at",
	TransportID: "tid", MessageID: "mid", Claims: "n_claims", Fence: "fencing_token",
}

// customTable creates, once per test binary, a table keyed by
// customAttributes.PartitionKey on dynalite.
var customTable = sync.OnceValues(func() (string, error) {
	name := "custom_attrs"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return name, dynamo.CreateTable(ctx, client, dynamo.TableConfig{Table: name, PartitionKey: customAttributes.PartitionKey, SkipTTL: true})
})

// The suite with every attribute named otherwise (fences included), on
// dynalite.
func TestConformanceCustomAttributes(t *testing.T) {
	table, err := customTable()
	if err != nil {
		t.Fatal(err)
	}
	storetest.Run(t, perCaseOf(dynamo.Config{Client: client, Table: table, Attributes: customAttributes}, true), featuresOf(t, customAttributes))
}

// The suite again on the wall clock with one shared store: proves the
// real-time path (deadlines from time.Now, millisecond rounding). The
// contention cases are smaller here: TestConformance runs them in full.
func TestConformanceRealClock(t *testing.T) {
	store := newStore(t, dynamo.Config{ClockSkewMargin: 50 * time.Millisecond})
	f := features(t)
	f.ControllableClock, f.ShortDuration, f.Contenders, f.DistinctKeys = false, 400*time.Millisecond, 50, 64
	storetest.Run(t, func(*testing.T) (dedup.Store, func(time.Duration)) { return store, nil }, f)
}

// The suite through a client that returns the old item with a failed
// condition, as real DynamoDB does: every Duplicate, InProgress and Conflict
// is then decided from the PutItem's own answer (one request per claim),
// and the store must never issue its fallback GetItem. The store is passed
// without its admin methods, whose GetItem would count as a fallback
// (TestConformance covers them). Contention is smaller than in
// TestConformance, which runs it in full: here it is the path that counts.
func TestConformanceWithOldItemReturned(t *testing.T) {
	c := &allOldClient{Client: client, pk: dynamo.DefaultPartitionKey}
	f := features(t)
	f.Admin, f.OneRequestClaim, f.Contenders, f.DistinctKeys = false, true, 50, 64
	// t.Run returns once the suite's parallel cases have finished.
	t.Run("suite", func(t *testing.T) { storetest.Run(t, perCase(c, testTable, false), f) })
	if t.Failed() {
		return
	}
	if n := c.attached.Load(); n == 0 {
		t.Fatalf("the wrapper attached no old item: the ALL_OLD path was not exercised")
	}
	if n := c.storeGets.Load(); n != 0 {
		t.Fatalf("the store issued %d fallback GetItem calls although every failed condition carried the old item", n)
	}
}

// The whole suite on a second implementation of the DynamoDB API: Python
// moto's server, which (unlike dynalite) returns the old item with a
// failed condition, as DynamoDB does (internal/testsupport/testserver TestMoto shows
// it on the wire): every claim is one request there, without a wrapper.
// testserver serves moto one request at a time: moto_server's threads take
// no lock around a conditional write, and two concurrent takeovers of one
// expired record both acquired it there. moto is optional: where
// moto_server is not installed the run is skipped with how to install it,
// and dynalite stays the required emulator.
func TestConformanceMoto(t *testing.T) {
	m, err := testserver.StartMoto()
	if errors.Is(err, testserver.ErrMotoMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	motoClient := newClient(m.Endpoint, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// moto has UpdateTimeToLive, so the table is created as in production.
	if err := dynamo.CreateTable(ctx, motoClient, dynamo.TableConfig{Table: testTable}); err != nil {
		t.Fatalf("CreateTable on moto: %v", err)
	}
	newMoto := perCase(motoClient, testTable, true)
	f := features(t)
	f.OneRequestClaim = true
	// moto refuses an item over its own estimate of the limit (405,000
	// bytes as it counts them, "between 409 and 410KB" by its authors'
	// measurement), below the 400 KB (409,600 bytes) of DynamoDB that the
	// store's MaxResultSize is computed for: the largest results that
	// DynamoDB and dynalite store, moto refuses with a ValidationException.
	tooSmall := "moto caps items at 405,000 bytes, below DynamoDB's 409,600 that MaxResultSize is computed for (dynalite runs this case)"
	f.Skip = map[string]string{"LargeResult": tooSmall, "ResultTooLarge": tooSmall}
	t.Run("suite", func(t *testing.T) { storetest.Run(t, newMoto, f) })
	t.Run("admin", func(t *testing.T) { storetest.RunAdmin(t, newMoto, f) })
	t.Run("router", func(t *testing.T) { storetest.RunRouter(t, newMoto, f) })
	t.Run("server-refuses-item-size", func(t *testing.T) { testServerRefusesItemSize(t, newMoto) })
}

// testServerRefusesItemSize: a result within MaxResultSize that the server
// still refuses for the item's size (moto's limit is lower than DynamoDB's)
// is ErrResultTooLarge, as the store's own check would say, so that the
// engine completes the record without the result. (It was the SDK's
// ValidationException, which the engine logs as a failed Complete, leaving
// the record in progress until its lease ends: the effect ran again after
// it.) moto, unlike DynamoDB, applies the update before it refuses it: the
// Complete without the result then finds the record completed by this very
// claim, ErrAlreadyCompleted, which the engine counts as completed; on
// DynamoDB nothing was written and that Complete succeeds. Either way a
// later claim is a duplicate.
func testServerRefusesItemSize(t *testing.T, newStore storetest.Constructor) {
	s, _ := newStore(t)
	ctx := context.Background()
	res, err := s.Claim(ctx, "item-size:k", "", time.Minute)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("Claim: %v, %v", res.Outcome, err)
	}
	max := s.(interface{ MaxResultSize() int }).MaxResultSize()
	err = s.Complete(ctx, res.Claim, make([]byte, max), time.Hour)
	if !errors.Is(err, dedup.ErrResultTooLarge) || !errors.Is(err, dynamo.ErrResultTooLarge) {
		t.Fatalf("Complete with a %d-byte result on moto: %v; want ErrResultTooLarge", max, err)
	}
	if err := s.Complete(ctx, res.Claim, nil, time.Hour); err != nil && !errors.Is(err, dedup.ErrAlreadyCompleted) {
		t.Fatalf("Complete without the result after ErrResultTooLarge: %v; want success or ErrAlreadyCompleted", err)
	}
	if again, err := s.Claim(ctx, "item-size:k", "", time.Minute); err != nil || again.Outcome != dedup.Duplicate {
		t.Fatalf("a later claim: %v, %v; want a duplicate", again.Outcome, err)
	}
}

// powertoolsLayout is the FormatPowertools layout of the conformance runs:
// Powertools' default attribute names, TypeScript results.
var powertoolsLayout = dynamo.PowertoolsLayout{Runtime: dynamo.PowertoolsTypeScript}

// powertoolsTable creates, once per test binary, a table keyed by
// Powertools' "id" on dynalite.
var powertoolsTable = sync.OnceValues(func() (string, error) {
	name := "powertools_records"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return name, dynamo.CreateTable(ctx, client, dynamo.TableConfig{Table: name, PartitionKey: dynamo.DefaultPowertoolsKeyAttr, SkipTTL: true})
})

// powertoolsFeatures are those of the native layout: Powertools' layout
// keeps the store's token, fence and who-and-when beside its own
// attributes; List reports a key as PowertoolsPartitionKey's inverse.
func powertoolsFeatures(t *testing.T, layout dynamo.PowertoolsLayout) storetest.Features {
	f := featuresOf(t, dynamo.AttributeNames{})
	f.MaxResultSize = newStore(t, dynamo.Config{Table: mustTable(t, powertoolsTable), Format: dynamo.FormatPowertools, Powertools: layout, SkipTableCheck: true}).MaxResultSize()
	f.ListedKey = func(key string) string {
		pk, err := dynamo.PowertoolsPartitionKey(key)
		if err != nil {
			t.Errorf("PowertoolsPartitionKey(%.40q): %v", key, err)
		}
		unescape := strings.NewReplacer("%23", "#", "%25", "%")
		scope, rest, scoped := strings.Cut(pk, "#")
		if !scoped {
			return unescape.Replace(pk)
		}
		return unescape.Replace(scope) + ":" + rest
	}
	return f
}

func mustTable(t *testing.T, table func() (string, error)) string {
	t.Helper()
	name, err := table()
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// The suites on Powertools' item layout (FormatPowertools) on dynalite:
// every case with TypeScript results, and the cases that store results
// with Python's. A completed record's retention ends on a whole second
// there (Powertools keeps expiration in epoch seconds), so the suite lets
// 1.5s expire (on the fake clock: no real wait). Contention is smaller
// than in TestConformance, which runs the same claim path in full.
func TestConformancePowertools(t *testing.T) {
	table := mustTable(t, powertoolsTable)
	for _, layout := range []dynamo.PowertoolsLayout{powertoolsLayout, {Runtime: dynamo.PowertoolsPython}} {
		name := map[dynamo.PowertoolsRuntime]string{dynamo.PowertoolsTypeScript: "typescript", dynamo.PowertoolsPython: "python"}[layout.Runtime]
		t.Run(name, func(t *testing.T) {
			newPT := perCaseOf(dynamo.Config{Client: client, Table: table, Format: dynamo.FormatPowertools, Powertools: layout}, true)
			f := powertoolsFeatures(t, layout)
			// BatchRequestSize 8 (not the 32 requests in flight) keeps
			// BatchLargerThanOneRequest small: the batch path is the
			// native one, claim by claim.
			f.Batch, f.BatchRequestSize = true, 8
			f.ShortDuration, f.Contenders, f.DistinctKeys = 1500*time.Millisecond, 10, 16
			if layout.Runtime == dynamo.PowertoolsPython {
				for _, c := range []struct {
					name string
					run  func(*testing.T, storetest.Constructor, storetest.Features)
				}{
					{"DuplicateAfterComplete", storetest.TestDuplicateAfterComplete},
					{"LargeResult", storetest.TestLargeResult},
					{"ResultTooLarge", storetest.TestResultTooLarge},
				} {
					t.Run(c.name, func(t *testing.T) { c.run(t, newPT, f) })
				}
				return
			}
			t.Run("suite", func(t *testing.T) { storetest.Run(t, newPT, f) })
			t.Run("admin", func(t *testing.T) { storetest.RunAdmin(t, newPT, f) })
			t.Run("batch", func(t *testing.T) { storetest.RunBatch(t, newPT, f) })
		})
	}
}
