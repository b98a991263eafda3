package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

// Every test runs on servers speaking the real protocols, on free loopback
// ports: fauxqs (SQS and SNS), a real redis-server and dynalite (DynamoDB),
// found through the AWS SDK's standard endpoint variables and REDIS_ADDR,
// as the example finds them.
var redisAddr string

func TestMain(m *testing.M) {
	testserver.Main(m, func() (func(), error) {
		var closers []func() error
		cleanup := func() {
			for _, c := range closers {
				_ = c()
			}
		}
		fq, err := testserver.StartFauxqs()
		if err != nil {
			return nil, err
		}
		closers = append(closers, fq.Close)
		dyn, err := testserver.StartDynalite()
		if err != nil {
			cleanup()
			return nil, err
		}
		closers = append(closers, dyn.Close)
		r, err := testserver.StartRedis()
		if err != nil {
			cleanup()
			return nil, err
		}
		closers = append(closers, r.Close)
		redisAddr = r.Addr
		for k, v := range map[string]string{
			"AWS_ENDPOINT_URL":          fq.Endpoint,
			"AWS_ENDPOINT_URL_DYNAMODB": dyn.Endpoint,
		} {
			if err := os.Setenv(k, v); err != nil {
				cleanup()
				return nil, err
			}
		}
		return cleanup, nil
	})
}

// testConfig returns the example's defaults with names of its own, so tests
// run in parallel on one emulator and one Redis.
func testConfig(t *testing.T, store string) config {
	id := strings.ToLower(watermill.NewShortUUID())
	cfg, err := parseFlags([]string{
		"-store", store, "-redis-addr", redisAddr, "-dynamo-table", "example-test",
		"-queue", "orders-" + id, "-topic", "events-" + id, "-sns-queue", "orders-sns-" + id,
		"-scope", "charge-order-" + id, "-timeout", "90s",
	}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The demo on both queues and both stores: 8 messages of 3 orders, one
// first charge failing; each order is charged once, every copy that is not
// charged is acked as a duplicate, and both queues end empty.
func TestDemoChargesEachOrderOnce(t *testing.T) {
	for _, store := range []string{"redis", "dynamo"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			w := lockWriter(&out)
			l, p := newLedger(w), newPrinter(w)
			err := runWith(context.Background(), testConfig(t, store), demoOrders, l, p, w)
			t.Log("\n" + out.String())
			if err != nil {
				t.Fatal(err)
			}
			summary, charges := l.summary()
			if charges != 3 || summary != "ORDER-001 x1, ORDER-003 x1, ORDER-004 x1" {
				t.Errorf("%d charges: %s", charges, summary)
			}
			// 3 charges and 1 failed attempt won a claim; the failed one was
			// released; the other 8-3 copies were acked as duplicates (some
			// after being deferred while another consumer held the key).
			if won, rel, dup := p.count(event.ClaimWon), p.count(event.Released), p.count(event.SkipDuplicate); won != 4 || rel != 1 || dup != 5 {
				t.Errorf("claims won %d, released %d, duplicates skipped %d; want 4, 1, 5", won, rel, dup)
			}
			for _, want := range []string{
				"published ORDER-003 to queue orders-",
				"published ORDER-003 to topic events-",
				"failed   ORDER-004 payment gateway timed out (via sns",
				"8 messages, 3 distinct orders, 3 charges: ORDER-001 x1, ORDER-003 x1, ORDER-004 x1",
				"no message waiting or in flight",
			} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q", want)
				}
			}
		})
	}
}

// Without the middleware every copy is charged: the duplicates are real.
func TestDemoWithoutIdempotencyChargesEveryCopy(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, "redis")
	cfg.idempotency = false
	var out bytes.Buffer
	w := lockWriter(&out)
	l := newLedger(w)
	err := runWith(context.Background(), cfg, demoOrders, l, newPrinter(w), w)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if summary, charges := l.summary(); charges != 8 || summary != "ORDER-001 x1, ORDER-003 x5, ORDER-004 x2" {
		t.Errorf("%d charges: %s", charges, summary)
	}
}

// SQS redelivers a message whose visibility timeout (1s here) ends while
// its first delivery is still being charged. The copy finds the key in
// progress and is nacked; when it comes back the charge is complete and it
// is acked as a duplicate: one charge.
func TestVisibilityTimeoutRedeliveryIsChargedOnce(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, "redis")
	cfg.visibility, cfg.retryAfter, cfg.receivers = time.Second, time.Second, 2

	var out bytes.Buffer
	w := lockWriter(&out)
	l, p := newLedger(w), newPrinter(w)
	inProgress := make(chan struct{})
	var once sync.Once
	p.seen = func(d dedup.Decision) {
		if d.Event == event.InProgress {
			once.Do(func() { close(inProgress) })
		}
	}
	var (
		first    sync.Once
		hookErrs = make(chan string, 1)
	)
	l.block = func(o order) {
		first.Do(func() {
			// Hold the first charge until SQS has delivered the message
			// again (after the visibility timeout) to the other receiver.
			select {
			case <-inProgress:
			case <-time.After(60 * time.Second):
				hookErrs <- "no copy was redelivered while the first charge ran"
			}
		})
	}
	orders := []publication{{via: "sqs", order: order{"ORDER-007", 70, "BRL"}, copies: 1}}
	err := runWith(context.Background(), cfg, orders, l, p, w)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-hookErrs:
		t.Fatal(e)
	default:
	}
	if _, charges := l.summary(); charges != 1 {
		t.Errorf("%d charges, want 1", charges)
	}
	if won, inprog, dup := p.count(event.ClaimWon), p.count(event.InProgress), p.count(event.SkipDuplicate); won != 1 || inprog < 1 || dup < 1 {
		t.Errorf("claims won %d, in progress %d, duplicates skipped %d; want 1, ≥1, ≥1", won, inprog, dup)
	}
}

// With no emulator answering, the example says how to start one.
func TestHintWhenNoEndpointAnswers(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "http://" + l.Addr().String()
	_ = l.Close()
	t.Setenv("AWS_ENDPOINT_URL", endpoint)
	var out, errOut bytes.Buffer
	if code := run(context.Background(), nil, &out, &errOut); code != 1 {
		t.Fatalf("exit %d, want 1\n%s%s", code, out.String(), errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], endpoint) || !strings.HasPrefix(lines[1], "hint: start the local SQS/SNS emulator") {
		t.Errorf("stderr:\n%s", errOut.String())
	}
	if code := run(context.Background(), []string{"-store", "floppy"}, &out, &errOut); code != 2 {
		t.Errorf("-store floppy: exit %d, want 2", code)
	}
}
