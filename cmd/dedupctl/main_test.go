package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// The servers of this package's tests: a redis-server, dynalite with one
// table, PostgreSQL. A Cluster is started by the test that needs it.
var (
	redisAddr      string
	dynamoEndpoint string
	pgDSN          string
)

const dynamoTable = "dedupctl_test"

func TestMain(m *testing.M) {
	goredis.SetLogger(discardLogger{}) // as main does
	testserver.Main(m, func() (func(), error) {
		var closers []func()
		cleanup := func() {
			for _, c := range closers {
				c()
			}
		}
		r, err := testserver.StartRedis()
		if err != nil {
			return nil, err
		}
		closers = append(closers, func() { _ = r.Close() })
		redisAddr = r.Addr

		dyn, err := testserver.StartDynalite()
		if err != nil {
			cleanup()
			return nil, err
		}
		closers = append(closers, func() { _ = dyn.Close() })
		dynamoEndpoint = dyn.Endpoint
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := dynamo.CreateTable(ctx, dynamoClient(), dynamo.TableConfig{Table: dynamoTable, SkipTTL: true}); err != nil {
			cleanup()
			return nil, err
		}

		pg, err := testserver.StartPostgres()
		if err != nil {
			cleanup()
			return nil, err
		}
		closers = append(closers, func() { _ = pg.Close() })
		pgDSN = pg.DSN
		return cleanup, nil
	})
}

func dynamoClient() *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(dynamoEndpoint),
	})
}

// ctl runs the command line and returns its exit status and output.
func ctl(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// mustCtl runs the command line and fails the test unless it exits with
// want.
func mustCtl(t *testing.T, want int, args ...string) string {
	t.Helper()
	code, out, errOut := ctl(t, args...)
	if code != want {
		t.Fatalf("dedupctl %q exited %d, want %d\nstdout:\n%s\nstderr:\n%s", args, code, want, out, errOut)
	}
	return out
}

// create claims key and, unless result is nil, completes it.
func create(t *testing.T, s dedup.Store, key, fp string, result []byte) {
	t.Helper()
	createAs(t, s, dedup.Origin{}, key, fp, result)
}

// origin is what a Watermill message from SQS claims with.
var origin = dedup.Origin{TransportID: "0b9f8e3c-4d1a-4e2b-9c3d-5e6f7a8b9c0d", MessageID: "73fca7ac-78e9-4ea4-a1bf-71a92e2fbda8"}

// createAs is create with the claim's Origin.
func createAs(t *testing.T, s dedup.Store, o dedup.Origin, key, fp string, result []byte) {
	t.Helper()
	ctx := dedup.WithOrigin(context.Background(), o)
	res, err := s.Claim(ctx, key, fp, time.Hour)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("Claim %q: %v %v", key, res.Outcome, err)
	}
	if result != nil {
		if err := s.Complete(ctx, res.Claim, result, 24*time.Hour); err != nil {
			t.Fatal(err)
		}
	}
}

func decodeJSON[T any](t *testing.T, out string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	return v
}

type jsonPage struct {
	Records    []jsonRecord `json:"records"`
	NextCursor string       `json:"next_cursor"`
}

// listKeys pages through "list -json" with the given flags and returns the
// keys, sorted.
func listKeys(t *testing.T, limit int, args ...string) []string {
	t.Helper()
	var keys []string
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("the listing does not end")
		}
		a := append([]string{"list", "-json", "-limit", fmt.Sprint(limit)}, args...)
		if cursor != "" {
			a = append(a, "-cursor", cursor)
		}
		page := decodeJSON[jsonPage](t, mustCtl(t, exitOK, a...))
		if len(page.Records) > limit {
			t.Fatalf("page of %d records, limit %d", len(page.Records), limit)
		}
		for _, r := range page.Records {
			keys = append(keys, r.Key)
		}
		if page.NextCursor == "" {
			sort.Strings(keys)
			return slicesCompact(keys)
		}
		cursor = page.NextCursor
	}
}

// slicesCompact drops repeated keys (Redis SCAN may list a key twice).
func slicesCompact(keys []string) []string {
	out := keys[:0]
	for i, k := range keys {
		if i == 0 || k != keys[i-1] {
			out = append(out, k)
		}
	}
	return out
}

// closedAddr returns a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

func TestUsageErrors(t *testing.T) {
	t.Setenv("REDIS_ADDR", "")
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"inspect"},
		{"inspect", "a:1", "a:2"},
		{"evict"},
		{"list", "a:"},
		{"list", "-limit", "0"},
		{"list", "-limit", "1001"},
		{"list", "-all", "-cursor", "abc"},
		{"-no-such-flag", "list"},
		{"list", "-no-such-flag"},
		{"-timeout", "0s", "list"},
		{"-store", "floppy", "inspect", "a:1"},
		{"inspect", "a:1"}, // no Redis address
		{"-redis-addr", "redis://[::1", "inspect", "a:1"},
		{"-redis-addr", redisAddr, "-redis-prefix", "", "inspect", "a:1"},
		{"-store", "postgres", "-postgres-dsn", "not a dsn = =", "inspect", "a:1"},
	} {
		if code, out, errOut := ctl(t, args...); code != exitUsage {
			t.Errorf("dedupctl %q exited %d, want %d\n%s%s", args, code, exitUsage, out, errOut)
		}
	}
	if out := mustCtl(t, exitOK, "help"); !strings.Contains(out, "Exit status: 0 done, 1 error, 2 usage, 3 no record under KEY.") {
		t.Errorf("help:\n%s", out)
	}
}

// A server that does not answer is an error (1), not a usage error.
func TestUnreachableStores(t *testing.T) {
	t.Setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://"+closedAddr(t))
	for _, args := range [][]string{
		{"-redis-addr", closedAddr(t), "list"},
		{"-store", "dynamo", "-timeout", "5s", "inspect", "a:1"},
		{"-store", "postgres", "-postgres-dsn", "postgres://postgres@" + closedAddr(t) + "/postgres?sslmode=disable", "list"},
	} {
		code, out, errOut := ctl(t, args...)
		if code != exitError || errOut == "" {
			t.Errorf("dedupctl %q exited %d, want %d with a message\n%s%s", args, code, exitError, out, errOut)
		}
	}
}

func TestRedis(t *testing.T) {
	ctx := context.Background()
	client := goredis.NewClient(&goredis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = client.Close() })
	prefix := fmt.Sprintf("dedupctl-%d:", time.Now().UnixNano())
	store, err := dedupredis.New(ctx, dedupredis.Config{Client: client, KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 9 {
		key := admin.ScopedKey("charge-orders", fmt.Sprintf("ORDER-%03d", i))
		create(t, store, key, "", []byte{})
		want = append(want, key)
	}
	createAs(t, store, origin, "charge-orders:ORDER-100", "payload-sha", []byte("12345"))
	createAs(t, store, origin, "charge-orders:ORDER-101", "", nil) // in progress
	want = append(want, "charge-orders:ORDER-100", "charge-orders:ORDER-101")
	create(t, store, "refunds:ORDER-000", "", []byte{})
	flags := []string{"-redis-addr", redisAddr, "-redis-prefix", prefix}

	// inspect, text and JSON, by scoped key or with -scope; flags go
	// before or after the command and the key.
	out := mustCtl(t, exitOK, append(flags, "inspect", "charge-orders:ORDER-100")...)
	sum := sha256.Sum256([]byte("payload-sha"))
	digest := hex.EncodeToString(sum[:16])
	for _, re := range []string{
		`(?m)^key:\s+charge-orders:ORDER-100$`,
		`(?m)^state:\s+completed$`,
		`(?m)^retention left:\s+\d+h\d+m\d+s \(copies are acked`,
		`(?m)^claimed at:\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z \(\S+ ago; the first claim\)$`,
		`(?m)^completed at:\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z \(\S+ ago; \S+ after the first claim\)$`,
		`(?m)^claims:\s+1$`,
		`(?m)^transport id:\s+` + origin.TransportID + ` \(the first claim's`,
		`(?m)^message id:\s+` + origin.MessageID + ` \(the first claim's broker message id`,
		`(?m)^fingerprint:\s+` + digest + `$`,
		`(?m)^result:\s+5 bytes$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("inspect output lacks %s:\n%s", re, out)
		}
	}
	rec := decodeJSON[jsonRecord](t, mustCtl(t, exitOK, append([]string{"inspect", "-scope", "charge-orders", "ORDER-101", "-json"}, flags...)...))
	if rec.Key != "charge-orders:ORDER-101" || rec.State != admin.StateInProgress || rec.RemainingMillis <= 0 ||
		rec.RemainingMillis > time.Hour.Milliseconds() || rec.Created != nil || rec.CompletedEstimate != nil ||
		rec.ClaimedAt == nil || rec.CompletedAt != nil || rec.Claims != 1 || rec.TransportID != origin.TransportID || rec.MessageID != origin.MessageID {
		t.Errorf("inspect -json in progress = %+v", rec)
	}
	rec = decodeJSON[jsonRecord](t, mustCtl(t, exitOK, append(flags, "-json", "inspect", "charge-orders:ORDER-100")...))
	if rec.ClaimedAt == nil || rec.CompletedAt == nil || rec.CompletedAt.Before(*rec.ClaimedAt) || rec.Claims != 1 ||
		rec.TransportID != origin.TransportID || rec.MessageID != origin.MessageID || rec.CompletedEstimate != nil {
		t.Errorf("inspect -json completed = %+v", rec)
	}
	// A record without its completion time (OmitProvenance): -retention
	// estimates when it was completed.
	omitting, err := dedupredis.New(ctx, dedupredis.Config{Client: client, KeyPrefix: prefix, OmitProvenance: true})
	if err != nil {
		t.Fatal(err)
	}
	createAs(t, omitting, origin, "lean:ORDER-1", "", []byte{})
	out = mustCtl(t, exitOK, append(flags, "inspect", "lean:ORDER-1")...)
	if !regexp.MustCompile(`(?m)^claimed at:\s+not recorded`).MatchString(out) || strings.Contains(out, "claims:") {
		t.Errorf("inspect of a record without provenance:\n%s", out)
	}
	rec = decodeJSON[jsonRecord](t, mustCtl(t, exitOK, append(flags, "-json", "-retention", "24h", "inspect", "lean:ORDER-1")...))
	if rec.CompletedEstimate == nil || rec.Created != nil || rec.ClaimedAt != nil {
		t.Errorf("inspect -retention 24h = %+v, want a completion estimate", rec)
	}
	out = mustCtl(t, exitOK, append(flags, "-retention", "1h", "inspect", "lean:ORDER-1")...)
	if !strings.Contains(out, "more than -retention 1h0m0s is left") {
		t.Errorf("inspect with a -retention shorter than what is left:\n%s", out)
	}
	if code, _, errOut := ctl(t, append(flags, "inspect", "charge-orders:ORDER-999")...); code != exitNotFound || !strings.Contains(errOut, "no record") {
		t.Errorf("inspect missing key: exit %d, %q", code, errOut)
	}

	// list: pages of every size find every record of the scope once.
	for _, limit := range []int{1, 4, 1000} {
		if got := listKeys(t, limit, append(flags, "-scope", "charge-orders")...); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("list -limit %d = %v, want %v", limit, got, want)
		}
	}
	if got := listKeys(t, 5, append(flags, "-scope", "charge-orders", "-prefix", "ORDER-10")...); fmt.Sprint(got) != fmt.Sprint(want[9:]) {
		t.Errorf("list -scope -prefix = %v, want %v", got, want[9:])
	}
	out = mustCtl(t, exitOK, append(flags, "list", "-all", "-limit", "3")...)
	if !strings.Contains(out, fmt.Sprintf("%d record(s) under prefix \"\"", len(want)+2)) || strings.Contains(out, "more:") ||
		!regexp.MustCompile(`(?m)^KEY\s+STATE\s+LEFT\s+AGE\s+CLAIMS\s+TRANSPORT ID\s+MESSAGE ID\s+RESULT\s+FINGERPRINT$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^charge-orders:ORDER-100\s+completed\s+\d+h\d+m\d+s\s+\S+\s+1\s+`+origin.TransportID+`\s+`+origin.MessageID+`\s+5 B\s+`+digest[:19]+`…$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^charge-orders:ORDER-101\s+in_progress\s+(\d+m)?\d+s\s+\S+\s+1\s+`+origin.TransportID+`\s+\S+\s+0 B\s+-$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^charge-orders:ORDER-000\s+completed\s+\d+h\d+m\d+s\s+\S+\s+1\s+-\s+-\s+0 B\s+-$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^lean:ORDER-1\s+completed\s+\d+h\d+m\d+s\s+-\s+-\s+-\s+-\s+0 B\s+-$`).MatchString(out) {
		t.Errorf("list -all:\n%s", out)
	}
	out = mustCtl(t, exitOK, append(flags, "list", "-limit", "2")...)
	if !regexp.MustCompile(`(?m)^more: -cursor \S+$`).MatchString(out) {
		t.Errorf("list -limit 2 names no cursor:\n%s", out)
	}
	if code, _, _ := ctl(t, append(flags, "list", "-cursor", "not-a-cursor")...); code != exitUsage {
		t.Errorf("list with a bad cursor exited %d, want %d", code, exitUsage)
	}

	// evict: the record is gone, the owner's claim is lost, a second evict
	// finds nothing.
	out = mustCtl(t, exitOK, append(flags, "evict", "-scope", "charge-orders", "ORDER-100")...)
	if !regexp.MustCompile(`^evicted charge-orders:ORDER-100: it was a completed record with \d+h\d+m\d+s left\.\n`).MatchString(out) ||
		!strings.Contains(out, "The next delivery of this key runs the handler again") {
		t.Errorf("evict output:\n%s", out)
	}
	if code, _, _ := ctl(t, append(flags, "inspect", "charge-orders:ORDER-100")...); code != exitNotFound {
		t.Errorf("inspect after evict exited %d, want %d", code, exitNotFound)
	}
	if code, _, _ := ctl(t, append(flags, "evict", "charge-orders:ORDER-100")...); code != exitNotFound {
		t.Errorf("second evict exited %d, want %d", code, exitNotFound)
	}
	ev := decodeJSON[struct {
		Key     string      `json:"key"`
		Evicted bool        `json:"evicted"`
		Was     *jsonRecord `json:"was"`
	}](t, mustCtl(t, exitOK, append(flags, "-json", "evict", "charge-orders:ORDER-101")...))
	if !ev.Evicted || ev.Was == nil || ev.Was.State != admin.StateInProgress {
		t.Errorf("evict -json = %+v", ev)
	}
	if res, err := store.Claim(ctx, "charge-orders:ORDER-100", "", time.Minute); err != nil || res.Outcome != dedup.Acquired {
		t.Errorf("Claim after evict = %v, %v; want acquired", res.Outcome, err)
	}

	// REDIS_ADDR is the default server, as for the examples and the lab.
	t.Setenv("REDIS_ADDR", redisAddr)
	if got := listKeys(t, 100, "-redis-prefix", prefix, "-scope", "refunds"); fmt.Sprint(got) != "[refunds:ORDER-000]" {
		t.Errorf("list with REDIS_ADDR = %v", got)
	}
}

// Comma-separated addresses are a Cluster: the listing covers every
// master.
func TestRedisCluster(t *testing.T) {
	cluster, err := testserver.StartRedisCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Close() })
	client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cluster.Addrs})
	t.Cleanup(func() { _ = client.Close() })
	store, err := dedupredis.New(context.Background(), dedupredis.Config{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 30 {
		key := admin.ScopedKey("charge-orders", fmt.Sprintf("ORDER-%03d", i))
		create(t, store, key, "", []byte{})
		want = append(want, key)
	}
	addr := strings.Join(cluster.Addrs, ",")
	for _, limit := range []int{1, 7, 1000} {
		if got := listKeys(t, limit, "-redis-addr", addr); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("list -limit %d on the Cluster = %v, want %v", limit, got, want)
		}
	}
	mustCtl(t, exitOK, "-redis-addr", addr, "evict", want[0])
	mustCtl(t, exitNotFound, "-redis-addr", addr, "inspect", want[0])
	mustCtl(t, exitOK, "-redis-addr", addr, "inspect", want[1])
}

func TestDynamo(t *testing.T) {
	t.Setenv("AWS_ENDPOINT_URL_DYNAMODB", dynamoEndpoint)
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	store, err := dynamo.New(context.Background(), dynamo.Config{Client: dynamoClient(), Table: dynamoTable, SkipTTL: true})
	if err != nil {
		t.Fatal(err)
	}
	scope := "charge-" + storekit.NewToken()[:8]
	long := admin.ScopedKey(scope, strings.Repeat("L", 600))
	longPK, err := dynamo.PartitionKey(long)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{longPK}
	for i := range 6 {
		key := admin.ScopedKey(scope, fmt.Sprintf("ORDER-%03d", i))
		create(t, store, key, "fp", []byte("ok"))
		want = append(want, key)
	}
	create(t, store, long, "", nil)
	sort.Strings(want)
	flags := []string{"-store", "dynamo", "-dynamo-table", dynamoTable}

	out := mustCtl(t, exitOK, append(flags, "inspect", "-scope", scope, "ORDER-001")...)
	for _, re := range []string{`(?m)^state:\s+completed$`, `(?m)^fingerprint:\s+fp$`, `(?m)^result:\s+2 bytes$`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("inspect output lacks %s:\n%s", re, out)
		}
	}
	// A long key is found by the key itself (hashed the store's way); the
	// listing shows its partition key.
	rec := decodeJSON[jsonRecord](t, mustCtl(t, exitOK, append(flags, "-json", "inspect", long)...))
	if rec.Key != long || rec.State != admin.StateInProgress {
		t.Errorf("inspect long key = %+v", rec)
	}
	for _, limit := range []int{2, 1000} {
		if got := listKeys(t, limit, append(flags, "-scope", scope)...); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("list -limit %d = %q, want %q", limit, got, want)
		}
	}
	mustCtl(t, exitOK, append(flags, "evict", long)...)
	mustCtl(t, exitNotFound, append(flags, "evict", long)...)
	if got := listKeys(t, 1000, append(flags, "-scope", scope)...); fmt.Sprint(got) != fmt.Sprint(want[1:]) { // longPK sorted first
		t.Errorf("list after evict = %q", got)
	}
	mustCtl(t, exitNotFound, append(flags, "inspect", admin.ScopedKey(scope, "nothing"))...)
}

func TestPostgres(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	schema := "dedupctl_" + storekit.NewToken()[:8]
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
	var want []string
	for i := range 5 {
		key := admin.ScopedKey("charge-orders", fmt.Sprintf("ORDER-%03d", i))
		createAs(t, store, origin, key, "fp", []byte("abc"))
		want = append(want, key)
	}
	// A fingerprint text cannot hold is stored as "\x01sha256:…": shown
	// quoted.
	createAs(t, store, origin, "binary:ORDER-1", "\xff\x00", nil)
	flags := []string{"-store", "postgres", "-postgres-dsn", pgDSN, "-postgres-schema", schema}

	out := mustCtl(t, exitOK, append(flags, "inspect", "charge-orders:ORDER-002")...)
	for _, re := range []string{
		`(?m)^state:\s+completed$`,
		`(?m)^claimed at:\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z \(\S+ ago; the first claim\)$`,
		`(?m)^completed at:\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z \(\S+ ago; \S+ after the first claim\)$`,
		`(?m)^claims:\s+1$`,
		`(?m)^transport id:\s+` + origin.TransportID + ` `,
		`(?m)^created:\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z \(\S+ ago; the claim that holds or last held the key\)$`,
		`(?m)^fingerprint:\s+fp$`,
		`(?m)^result:\s+3 bytes$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("inspect output lacks %s:\n%s", re, out)
		}
	}
	if rec := decodeJSON[jsonRecord](t, mustCtl(t, exitOK, append(flags, "-json", "inspect", "charge-orders:ORDER-002")...)); rec.Created == nil ||
		rec.ClaimedAt == nil || rec.CompletedAt == nil || rec.Claims != 1 || rec.MessageID != origin.MessageID {
		t.Errorf("inspect -json = %+v, want created, claimed, completed, 1 claim, the message id", rec)
	}
	out = mustCtl(t, exitOK, append(flags, "inspect", "binary:ORDER-1")...)
	if !regexp.MustCompile(`(?m)^fingerprint:\s+"\\x01sha256:[0-9a-f]{64}"$`).MatchString(out) {
		t.Errorf("inspect of a binary fingerprint, want it quoted:\n%s", out)
	}
	if got := listKeys(t, 2, append(flags, "-scope", "charge-orders")...); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("list = %v, want %v", got, want)
	}
	mustCtl(t, exitOK, append(flags, "evict", "charge-orders:ORDER-002")...)
	mustCtl(t, exitNotFound, append(flags, "inspect", "charge-orders:ORDER-002")...)
	// DATABASE_URL is the default connection string.
	t.Setenv("DATABASE_URL", pgDSN)
	if got := listKeys(t, 10, "-store", "postgres", "-postgres-schema", schema); len(got) != 5 {
		t.Errorf("list with DATABASE_URL = %v", got)
	}
}
