package main

import (
	"context"
	"fmt"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// jsonSummary is the output of `summary -json`.
type jsonSummary struct {
	Prefix          string      `json:"prefix"`
	Records         int         `json:"records"`
	Pages           int         `json:"pages"`
	AbandonedListed bool        `json:"abandoned_listed"`
	AbandonedNote   string      `json:"abandoned_note"`
	Scopes          []jsonScope `json:"scopes"`
}

// fillScopes writes, with clock-dated claims, into scope: three completed
// keys and two in progress (OLD claimed ten minutes before NEW); into
// scope+"-refunds": one completed key.
func fillScopes(t *testing.T, s dedup.Store, clock *fakeclock.Clock, scope string) {
	t.Helper()
	ctx := dedup.WithOrigin(context.Background(), origin)
	claim := func(scope, key string, lease time.Duration) dedup.Claim {
		t.Helper()
		res, err := s.Claim(ctx, admin.ScopedKey(scope, key), "", lease)
		if err != nil || res.Outcome != dedup.Acquired {
			t.Fatalf("claim %s %s: %v %v", scope, key, res.Outcome, err)
		}
		return res.Claim
	}
	claim(scope, "OLD", 2*time.Hour)
	if clock != nil {
		clock.Advance(10 * time.Minute)
	} else {
		// The store's claim times have a millisecond's precision (Redis):
		// NEW is claimed in a later millisecond than OLD.
		for start := time.Now(); time.Now().UnixMilli() <= start.UnixMilli()+1; {
			runtime.Gosched()
		}
	}
	claim(scope, "NEW", 2*time.Hour)
	for _, k := range []string{"DONE-1", "DONE-2", "DONE-3"} {
		if err := s.Complete(ctx, claim(scope, k, time.Hour), nil, 24*time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Complete(ctx, claim(scope+"-refunds", "DONE-1", time.Hour), nil, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
}

// checkSummary runs summary on one scope (JSON and text) and on every scope
// of a store holding only fillScopes' records, and checks the counts.
func checkSummary(t *testing.T, flags []string, scope string, wantOldest string, abandoned *int) {
	t.Helper()
	s := decodeJSON[jsonSummary](t, mustCtl(t, exitOK, append(flags, "-json", "summary", "-scope", scope, "-page", "2")...))
	if s.Records < 5 || len(s.Scopes) != 1 || s.Pages < 3 || s.Prefix != admin.ScopePrefix(scope) {
		t.Fatalf("summary -scope %s: %+v", scope, s)
	}
	sc := s.Scopes[0]
	if sc.Scope != scope || sc.InProgress != 2 || sc.Completed != 3 || sc.Unreadable != 0 {
		t.Errorf("scope %+v, want 2 in progress, 3 completed", sc)
	}
	if (abandoned == nil) != (sc.Abandoned == nil) || abandoned != nil && *abandoned != *sc.Abandoned || s.AbandonedListed != (abandoned != nil) {
		t.Errorf("abandoned %v (listed %v), want %v", sc.Abandoned, s.AbandonedListed, abandoned)
	}
	if abandoned == nil && s.AbandonedNote == "" {
		t.Error("no note says why abandoned records are not counted")
	}
	if o := sc.OldestInProgress; o == nil || o.Key != admin.ScopedKey(scope, wantOldest) || o.State != admin.StateInProgress || o.TransportID != origin.TransportID {
		t.Errorf("oldest in progress %+v, want %s", o, wantOldest)
	}

	out := mustCtl(t, exitOK, append(flags, "summary", "-scope", scope)...)
	line := fmt.Sprintf(`(?m)^%s\s+2\s+3\s+0\s+\S+\s+%s \(claimed \S+ ago, 1 claim\(s\), lease left \S+\)`,
		regexp.QuoteMeta(scope), regexp.QuoteMeta(admin.ScopedKey(scope, wantOldest)))
	for _, re := range []string{`(?m)^SCOPE\s+IN PROGRESS\s+COMPLETED\s+UNREADABLE\s+ABANDONED\s+OLDEST IN PROGRESS\s+OLDEST ABANDONED$`,
		line, `(?m)^\d+ record\(s\) in 1 scope\(s\) under prefix "` + regexp.QuoteMeta(scope) + `:" in .*; \d+ page\(s\) read$`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("summary output lacks %s:\n%s", re, out)
		}
	}

	all := decodeJSON[jsonSummary](t, mustCtl(t, exitOK, append(flags, "-json", "summary", "-all-scopes")...))
	var names []string
	for _, sc := range all.Scopes {
		if strings.HasPrefix(sc.Scope, scope) {
			names = append(names, sc.Scope)
		}
	}
	if fmt.Sprint(names) != fmt.Sprint([]string{scope, scope + "-refunds"}) {
		t.Errorf("summary -all-scopes: scopes %v, want %s and %s-refunds", names, scope, scope)
	}

	// -pace holds every request after the first: with one record per
	// request, the command runs into its -timeout.
	code, _, errOut := ctl(t, append(flags, "-timeout", "3s", "summary", "-scope", scope, "-page", "1", "-pace", "1h")...)
	if code != exitError || !strings.Contains(errOut, "deadline exceeded") {
		t.Errorf("summary -pace 1h -timeout 3s exited %d (%s), want 1 on the deadline", code, errOut)
	}
}

// Without a scope or -all-scopes the summary refuses to read the store.
func TestSummaryUsage(t *testing.T) {
	flags := []string{"-redis-addr", redisAddr}
	for _, args := range [][]string{
		{"summary"},
		{"summary", "-all-scopes", "-scope", "a"},
		{"summary", "-scope", "a", "-page", "0"},
		{"summary", "-scope", "a", "-page", "1001"},
		{"summary", "-scope", "a", "-pace", "-1s"},
		{"summary", "-scope", "a", "KEY"},
	} {
		if code, _, errOut := ctl(t, append(flags, args...)...); code != exitUsage || errOut == "" {
			t.Errorf("dedupctl %q exited %d (%q), want 2 with a message", args, code, errOut)
		}
	}
	_, _, errOut := ctl(t, append(flags, "summary")...)
	if !strings.Contains(errOut, "-all-scopes") {
		t.Errorf("the refusal does not name -all-scopes: %s", errOut)
	}
}

func TestSummaryRedis(t *testing.T) {
	ctx := context.Background()
	client := goredis.NewClient(&goredis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = client.Close() })
	prefix := fmt.Sprintf("dedupctl-summary-%d:", time.Now().UnixNano())
	store, err := dedupredis.New(ctx, dedupredis.Config{Client: client, KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	fillScopes(t, store, nil, "charge-orders")
	// Redis keeps the claim time by the claiming process's clock: OLD was
	// claimed first.
	checkSummary(t, []string{"-redis-addr", redisAddr, "-redis-prefix", prefix}, "charge-orders", "OLD", nil)
}

func TestSummaryDynamo(t *testing.T) {
	t.Setenv("AWS_ENDPOINT_URL_DYNAMODB", dynamoEndpoint)
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	// Claims dated an hour ago: ABANDONED's one-minute lease ended 59
	// minutes before dedupctl (on the wall clock) reads it.
	clock := fakeclock.New(time.Now().Add(-time.Hour))
	store, err := dynamo.New(context.Background(), dynamo.Config{Client: dynamoClient(), Table: dynamoTable, Clock: clock, SkipTTL: true})
	if err != nil {
		t.Fatal(err)
	}
	scope := "charge-" + storekit.NewToken()[:8]
	res, err := store.Claim(context.Background(), admin.ScopedKey(scope, "ABANDONED"), "", time.Minute)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatal(res.Outcome, err)
	}
	fillScopes(t, store, clock, scope)
	one := 1
	flags := []string{"-store", "dynamo", "-dynamo-table", dynamoTable}
	checkSummary(t, flags, scope, "OLD", &one)
	s := decodeJSON[jsonSummary](t, mustCtl(t, exitOK, append(flags, "-json", "summary", "-scope", scope)...))
	if o := s.Scopes[0].OldestAbandoned; o == nil || o.Key != admin.ScopedKey(scope, "ABANDONED") || o.RemainingMillis > -58*60*1000 {
		t.Errorf("oldest abandoned %+v, want ABANDONED, its lease ended 59 minutes ago", o)
	}
	out := mustCtl(t, exitOK, append(flags, "summary", "-scope", scope)...)
	if !regexp.MustCompile(`\s1\s+` + regexp.QuoteMeta(scope) + `:OLD .* ` + regexp.QuoteMeta(scope) + `:ABANDONED \(lease ended 59m\d+s ago\)`).MatchString(out) {
		t.Errorf("the text summary does not show the abandoned record:\n%s", out)
	}
}

func TestSummaryPostgres(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	schema := "dedupctl_summary_" + storekit.NewToken()[:8]
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	store, err := postgres.New(ctx, postgres.Config{DB: conn, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	fillScopes(t, store, nil, "charge-orders")
	checkSummary(t, []string{"-store", "postgres", "-postgres-dsn", pgDSN, "-postgres-schema", schema}, "charge-orders", "OLD", nil)
}
