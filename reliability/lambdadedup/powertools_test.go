package lambdadedup_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup/powertools"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// The interoperability of a Go function (lambdadedup on the DynamoDB
// store in FormatPowertools, keys from lambdadedup/powertools) with a
// Powertools for AWS Lambda (TypeScript) function: the real
// @aws-lambda-powertools/idempotency 2.35.0, run by Node from
// testdata/powertools-function.cjs, on one table in dynalite. Both charge
// an order by adding 1 to its count in a charges table; each test checks
// the counts. Skipped without Node or tools/node_modules (make test
// installs both).

const ptPathKey = "powertools_json(body).order_id"

// ptTables creates the records table (Powertools' key "id") and the
// charges table of a test.
func ptTables(t *testing.T) (records, charges string) {
	t.Helper()
	n := queueSeq.Add(1)
	records, charges = fmt.Sprintf("pt_records_%d", n), fmt.Sprintf("pt_charges_%d", n)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dynamo.CreateTable(ctx, dynamoClient, dynamo.TableConfig{Table: records, PartitionKey: "id", SkipTTL: true}); err != nil {
		t.Fatal(err)
	}
	if err := dynamo.CreateTable(ctx, dynamoClient, dynamo.TableConfig{Table: charges, PartitionKey: "order", SkipTTL: true}); err != nil {
		t.Fatal(err)
	}
	return records, charges
}

// ptFunction is the Node process of testdata/powertools-function.cjs.
type ptFunction struct {
	t   *testing.T
	mu  sync.Mutex
	in  io.Writer
	out *bufio.Scanner
}

func startPowertools(t *testing.T, function, records, charges string) *ptFunction {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is missing (make test installs the test tools)")
	}
	modules, err := filepath.Abs("../../tools/node_modules")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(modules, "@aws-lambda-powertools", "idempotency", "package.json")); err != nil {
		t.Skip("tools/node_modules has no @aws-lambda-powertools/idempotency: run `npm ci --prefix tools` (make test does)")
	}
	cmd := exec.Command(node, "testdata/powertools-function.cjs")
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules, "NODE_NO_WARNINGS=1",
		"DYNAMO_ENDPOINT="+aws.ToString(dynamoClient.Options().BaseEndpoint), "TABLE="+records, "CHARGES="+charges,
		"AWS_LAMBDA_FUNCTION_NAME="+function, "EVENT_KEY_JMESPATH="+ptPathKey)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = in.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	return &ptFunction{t: t, in: in, out: sc}
}

// do sends one command and returns its answer.
func (p *ptFunction) do(cmd map[string]any) map[string]any {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	line, err := json.Marshal(cmd)
	if err != nil {
		p.t.Fatal(err)
	}
	if _, err := p.in.Write(append(line, '\n')); err != nil {
		p.t.Fatalf("writing to node: %v", err)
	}
	if !p.out.Scan() {
		p.t.Fatalf("node ended: %v", p.out.Err())
	}
	var answer map[string]any
	if err := json.Unmarshal(p.out.Bytes(), &answer); err != nil {
		p.t.Fatalf("node answered %q: %v", p.out.Text(), err)
	}
	return answer
}

// goFunction is the Go side: a lambdadedup SQS handler sharing the table.
type goFunction struct {
	h     *lambdadedup.Handler
	store *dynamo.Store
	keys  *powertools.Keys
	scope string
	ran   atomic.Int64
}

func newGoFunction(t *testing.T, function, records, charges string) *goFunction {
	t.Helper()
	store, err := dynamo.New(context.Background(), dynamo.Config{
		Client: dynamoClient, Table: records, SkipTTL: true, ClockSkewMargin: 100 * time.Millisecond,
		Format: dynamo.FormatPowertools, Powertools: dynamo.PowertoolsLayout{Runtime: dynamo.PowertoolsTypeScript},
	})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := powertools.New(powertools.Config{Runtime: powertools.TypeScript, Prefix: function, EventKeyJMESPath: ptPathKey})
	if err != nil {
		t.Fatal(err)
	}
	g := &goFunction{store: store, keys: keys, scope: function}
	g.h, err = lambdadedup.New(lambdadedup.Config{
		Dedup:       dedup.Config{Store: store, Key: keys.Key, Scope: function, Retention: time.Hour, Logger: watermill.NopLogger{}},
		Concurrency: 4,
	}, func(msg *message.Message) error {
		var body struct {
			OrderID string `json:"order_id"`
		}
		if err := json.Unmarshal(msg.Payload, &body); err != nil {
			return err
		}
		g.ran.Add(1)
		return charge(msg.Context(), charges, body.OrderID, "go")
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// handle runs one SQS batch through the Go function within a 30s
// invocation and returns the ids of its failed records.
func (g *goFunction) handle(t *testing.T, records ...events.SQSMessage) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := g.h.Handle(ctx, events.SQSEvent{Records: records})
	if err != nil && !errors.Is(err, lambdadedup.ErrBatchFailed) {
		t.Fatal(err)
	}
	var failed []string
	for _, f := range resp.BatchItemFailures {
		failed = append(failed, f.ItemIdentifier)
	}
	return failed
}

// scopedKey is the dedup record key of an order's event: the Powertools
// prefix as scope, the hash as key.
func (g *goFunction) scopedKey(t *testing.T, rec events.SQSMessage) string {
	t.Helper()
	return admin.ScopedKey(g.scope, g.hash(t, rec))
}

// hash is the business key of a record: its Powertools key after "#".
func (g *goFunction) hash(t *testing.T, rec events.SQSMessage) string {
	t.Helper()
	raw, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	key, err := g.keys.IdempotencyKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(key, g.scope+"#")
}

func charge(ctx context.Context, table, order, by string) error {
	_, err := dynamoClient.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(table),
		Key:                       map[string]ddbtypes.AttributeValue{"order": &ddbtypes.AttributeValueMemberS{Value: order}},
		UpdateExpression:          aws.String("ADD #n :one, #by :one"),
		ExpressionAttributeNames:  map[string]string{"#n": "count", "#by": by},
		ExpressionAttributeValues: map[string]ddbtypes.AttributeValue{":one": &ddbtypes.AttributeValueMemberN{Value: "1"}},
	})
	return err
}

// charges reads every order's charge count, and the counts by runtime.
func charges(t *testing.T, table string) (counts map[string]int, byRuntime map[string]int) {
	t.Helper()
	counts, byRuntime = map[string]int{}, map[string]int{}
	p := dynamodb.NewScanPaginator(dynamoClient, &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)})
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, item := range page.Items {
			order := item["order"].(*ddbtypes.AttributeValueMemberS).Value
			for _, attr := range []string{"count", "go", "typescript"} {
				if n, ok := item[attr].(*ddbtypes.AttributeValueMemberN); ok {
					v, _ := strconv.Atoi(n.Value)
					if attr == "count" {
						counts[order] = v
					} else {
						byRuntime[attr] += v
					}
				}
			}
		}
	}
	return counts, byRuntime
}

func ptRecord(id, orderID string) events.SQSMessage { return record(id, order(orderID)) }

// A record completed by the Powertools function is a duplicate for the Go
// function (its handler does not run), and the stored result is the
// Powertools function's, as JSON; the other way round, a record completed
// by the Go function is a duplicate for Powertools, which returns what
// the Go side stored: nothing for the SQS adapter (undefined, replayed as
// null), the work's JSON result for Engine.Do. Both compute the same key:
// the record's partition key is keys.IdempotencyKey of the record.
func TestPowertoolsCompletedIsDuplicateBothWays(t *testing.T) {
	records, chargesTable := ptTables(t)
	const fn = "charge-orders"
	pt := startPowertools(t, fn, records, chargesTable)
	g := newGoFunction(t, fn, records, chargesTable)

	// Powertools first.
	first := ptRecord("pt-1", "ORDER-1")
	if a := pt.do(map[string]any{"op": "process", "record": first}); a["error"] != nil {
		t.Fatalf("Powertools: %v", a["error"])
	}
	raw, _ := json.Marshal(first)
	wantKey, err := g.keys.IdempotencyKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	if a := pt.do(map[string]any{"op": "key", "record": first}); a["key"] != wantKey {
		t.Fatalf("Powertools' key %v, Go's %s", a["key"], wantKey)
	}
	item, err := dynamoClient.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(records),
		Key: map[string]ddbtypes.AttributeValue{"id": &ddbtypes.AttributeValueMemberS{Value: wantKey}}, ConsistentRead: aws.Bool(true)})
	if err != nil || len(item.Item) == 0 {
		t.Fatalf("no record under Go's key %s: %v", wantKey, err)
	}
	if failed := g.handle(t, ptRecord("go-copy-1", "ORDER-1")); len(failed) != 0 {
		t.Fatalf("the Go function failed the copy of a record Powertools completed: %v", failed)
	}
	if g.ran.Load() != 0 {
		t.Fatalf("the Go handler ran for a record Powertools completed")
	}
	res, err := g.store.Claim(context.Background(), g.scopedKey(t, first), "", time.Minute)
	if err != nil || res.Outcome != dedup.Duplicate || string(res.Result) != `{"by":"typescript","charged":"ORDER-1"}` {
		t.Fatalf("Claim of the Powertools record: %v %q, %v; want a duplicate with its result", res.Outcome, res.Result, err)
	}

	// Go first: the SQS adapter stores no result.
	if failed := g.handle(t, ptRecord("go-2", "ORDER-2")); len(failed) != 0 {
		t.Fatalf("Go: %v", failed)
	}
	a := pt.do(map[string]any{"op": "process", "record": ptRecord("pt-copy-2", "ORDER-2")})
	if a["error"] != nil || a["result"] != nil {
		t.Fatalf("Powertools on a record Go completed: %v; want no result (null) and no run", a)
	}

	// Go first through Engine.Do, with a JSON result Powertools replays.
	engine, err := dedup.NewEngine(dedup.Config{Store: g.store, Scope: fn, Retention: time.Hour, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Do(context.Background(), dedup.Call{Key: g.hash(t, ptRecord("go-3", "ORDER-3"))}, func(ctx context.Context) ([]byte, error) {
		return []byte(`{"by":"go","charged":"ORDER-3"}`), charge(ctx, chargesTable, "ORDER-3", "go")
	})
	if err != nil || out.Outcome != dedup.Acquired {
		t.Fatalf("Engine.Do: %v, %v", out.Outcome, err)
	}
	a = pt.do(map[string]any{"op": "process", "record": ptRecord("pt-copy-3", "ORDER-3")})
	if result, _ := json.Marshal(a["result"]); a["error"] != nil || string(result) != `{"by":"go","charged":"ORDER-3"}` {
		t.Fatalf("Powertools on a record Engine.Do completed: %v; want Go's result", a)
	}

	counts, _ := charges(t, chargesTable)
	for _, o := range []string{"ORDER-1", "ORDER-2", "ORDER-3"} {
		if counts[o] != 1 {
			t.Errorf("%s charged %d times, want once", o, counts[o])
		}
	}
}

// An in-progress Powertools record (an invocation that died after its
// claim) blocks the Go function's claim until its in_progress_expiration
// (the invocation's deadline), then the Go function takes it over; a
// Go claim in progress blocks the Powertools function until its lease
// (and the store's ClockSkewMargin) has passed, then Powertools takes it
// over. A Powertools function whose handler fails deletes its record: the
// Go function then runs the effect.
func TestPowertoolsInProgressBlocksBothWays(t *testing.T) {
	records, chargesTable := ptTables(t)
	const fn = "charge-orders"
	pt := startPowertools(t, fn, records, chargesTable)
	g := newGoFunction(t, fn, records, chargesTable)

	held := ptRecord("pt-1", "ORDER-1")
	const remaining = 1500 * time.Millisecond
	if a := pt.do(map[string]any{"op": "claim", "record": held, "remainingMs": remaining.Milliseconds()}); a["error"] != nil {
		t.Fatalf("Powertools claim: %v", a["error"])
	}
	deadline := time.Now().Add(remaining)
	if failed := g.handle(t, ptRecord("go-copy-1", "ORDER-1")); len(failed) != 1 {
		t.Fatalf("the Go function did not report the copy of a held record as failed: %v", failed)
	}
	time.Sleep(time.Until(deadline.Add(300 * time.Millisecond))) // past the expiry and the 100ms margin
	if failed := g.handle(t, ptRecord("go-copy-1b", "ORDER-1")); len(failed) != 0 {
		t.Fatalf("the Go function did not take over the expired Powertools claim: %v", failed)
	}

	// The other way round: a Go claim whose lease is live.
	second := ptRecord("go-2", "ORDER-2")
	const lease = time.Second
	res, err := g.store.Claim(context.Background(), g.scopedKey(t, second), "", lease)
	if err != nil || res.Outcome != dedup.Acquired {
		t.Fatalf("Go claim: %v, %v", res.Outcome, err)
	}
	leaseEnd := time.Now().Add(lease)
	if a := pt.do(map[string]any{"op": "process", "record": ptRecord("pt-copy-2", "ORDER-2")}); a["error"] == nil {
		t.Fatalf("Powertools ran a record the Go function holds: %v", a)
	} else if e, _ := a["error"].(string); len(e) < 33 || e[:33] != "IdempotencyAlreadyInProgressError" {
		t.Fatalf("Powertools on a held record: %v; want IdempotencyAlreadyInProgressError", e)
	}
	time.Sleep(time.Until(leaseEnd.Add(300 * time.Millisecond)))
	if a := pt.do(map[string]any{"op": "process", "record": ptRecord("pt-copy-2b", "ORDER-2")}); a["error"] != nil {
		t.Fatalf("Powertools did not take over the expired Go claim: %v", a["error"])
	}
	if err := g.store.Complete(context.Background(), res.Claim, nil, time.Hour); !errors.Is(err, dedup.ErrClaimLost) {
		t.Fatalf("Complete by the expired Go claim after Powertools took over: %v; want ErrClaimLost", err)
	}

	// A failing Powertools handler deletes its record.
	if a := pt.do(map[string]any{"op": "process", "record": ptRecord("pt-3", "ORDER-3"), "fail": true}); a["error"] == nil {
		t.Fatalf("the failing Powertools handler succeeded: %v", a)
	}
	if failed := g.handle(t, ptRecord("go-copy-3", "ORDER-3")); len(failed) != 0 {
		t.Fatalf("Go after a failed Powertools run: %v", failed)
	}

	counts, byRuntime := charges(t, chargesTable)
	for _, o := range []string{"ORDER-1", "ORDER-2", "ORDER-3"} {
		if counts[o] != 1 {
			t.Errorf("%s charged %d times, want once", o, counts[o])
		}
	}
	if byRuntime["go"] != 2 || byRuntime["typescript"] != 1 {
		t.Errorf("charges by runtime %v, want go 2 (ORDER-1, ORDER-3), typescript 1 (ORDER-2)", byRuntime)
	}
}

// A Powertools function and the Go function consume the same 1,000
// events at once, each event twice on each side (four copies, each with
// its own messageId), in batches, against one table: every event's effect
// runs once, whichever side runs it.
func TestPowertoolsAndGoConsumeTheSameEvents(t *testing.T) {
	records, chargesTable := ptTables(t)
	const fn = "charge-orders"
	pt := startPowertools(t, fn, records, chargesTable)
	g := newGoFunction(t, fn, records, chargesTable)
	const n = 1000
	var ptRecords, goRecords []events.SQSMessage
	for i := range n {
		o := fmt.Sprintf("EVENT-%04d", i)
		ptRecords = append(ptRecords, ptRecord(fmt.Sprintf("pt-%d-a", i), o), ptRecord(fmt.Sprintf("pt-%d-b", i), o))
		goRecords = append(goRecords, ptRecord(fmt.Sprintf("go-%d-a", i), o), ptRecord(fmt.Sprintf("go-%d-b", i), o))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(ptRecords), func(i, j int) { ptRecords[i], ptRecords[j] = ptRecords[j], ptRecords[i] })
	rng.Shuffle(len(goRecords), func(i, j int) { goRecords[i], goRecords[j] = goRecords[j], goRecords[i] })

	start := time.Now()
	var wg sync.WaitGroup
	var ptStats map[string]any
	wg.Go(func() {
		ptStats = pt.do(map[string]any{"op": "run", "records": ptRecords, "concurrency": 8})
	})
	goRetries := 0
	for i := 0; i < len(goRecords); i += 10 {
		batch := goRecords[i:min(i+10, len(goRecords))]
		for attempt := 0; len(batch) > 0; attempt++ {
			if attempt == 500 {
				t.Fatalf("records still failing after %d attempts: %v", attempt, batch)
			}
			failed := map[string]bool{}
			for _, id := range g.handle(t, batch...) {
				failed[id] = true
			}
			var again []events.SQSMessage
			for _, r := range batch {
				if failed[r.MessageId] {
					again = append(again, r)
				}
			}
			goRetries += len(again)
			batch = again
			if len(batch) > 0 {
				time.Sleep(20 * time.Millisecond) // SQS would bring them back
			}
		}
	}
	wg.Wait()
	if errs, _ := ptStats["errors"].([]any); ptStats["error"] != nil || len(errs) > 0 {
		t.Fatalf("Powertools: %v", ptStats)
	}
	counts, byRuntime := charges(t, chargesTable)
	if len(counts) != n {
		t.Errorf("%d events charged, want %d", len(counts), n)
	}
	for o, c := range counts {
		if c != 1 {
			t.Errorf("%s charged %d times, want once", o, c)
		}
	}
	if byRuntime["go"]+byRuntime["typescript"] != n {
		t.Errorf("charges by runtime %v, want %d in all", byRuntime, n)
	}
	t.Logf("%d events, 4 copies each, in %v: Go ran %d (%d records retried while in progress), Powertools %d (retries %v)",
		n, time.Since(start).Round(time.Millisecond), byRuntime["go"], goRetries, byRuntime["typescript"], ptStats["retries"])
}
