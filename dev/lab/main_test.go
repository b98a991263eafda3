package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

func TestLabCommandDefaults(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"-orders", "50", "-effect-time", "1ms"}, &out, &errOut); code != 0 {
		t.Fatalf("dedup-lab exited %d\n%s%s", code, out.String(), errOut.String())
	}
	// The default output: the header line, the table, one line per run,
	// and nothing about brokers or stores.
	want := []*regexp.Regexp{
		regexp.MustCompile(`^dedup-lab: ORDER-003 x10 \+ 50 other orders \(1-3 copies each\), broker gochannel, store memory, concurrency 8$`),
		regexp.MustCompile(`^$`),
		regexp.MustCompile(`^idempotency\s+messages\s+distinct orders\s+charges\s+claim won\s+duplicate skipped\s+in-progress retried\s+nacks$`),
		regexp.MustCompile(`^off\s+(\d+)\s+51\s+(\d+)\s+-\s+-\s+-\s+0$`),
		regexp.MustCompile(`^on\s+(\d+)\s+51\s+51\s+51\s+\d+\s+\d+\s+\d+$`),
		regexp.MustCompile(`^$`),
		regexp.MustCompile(`^idempotency off: \d+ charges for \d+ messages: every copy charged again \(\d+\.\d\ds\)$`),
		regexp.MustCompile(`^idempotency on:  51 charges for 51 distinct orders: every order charged exactly once \(\d+\.\d\ds\)$`),
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i, re := range want {
		if !re.MatchString(lines[i]) {
			t.Errorf("line %d = %q, want %v", i+1, lines[i], re)
		}
	}
}

// -runtime lambda: ORDER-003 ten times through lambdadedup, one charge.
func TestLabCommandLambdaRuntime(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"-runtime", "lambda", "-orders", "0", "-concurrency", "5", "-effect-time", "1ms"}, &out, &errOut); code != 0 {
		t.Fatalf("dedup-lab exited %d\n%s%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{
		"runtime lambda (SQS batches of up to 10, 5 invocations at once), store memory",
		"idempotency off: 10 charges for 10 messages",
		"idempotency on:  1 charges for 1 distinct orders",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestLabCommandRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-idempotency", "maybe"},
		{"-copies", "0"},
		{"-lose-acks", "-1"},
		{"-broker", "carrier-pigeon"},
		{"-store", "floppy"},
		{"-no-such-flag"},
		{"-runtime", "mainframe"},
		{"-runtime", "lambda", "-broker", "kafka"},
		{"-runtime", "lambda", "-lose-acks", "1"},
	} {
		if code := run(args, io.Discard, io.Discard); code != 2 {
			t.Errorf("dedup-lab %v exited %d, want 2", args, code)
		}
	}
}

// With no KAFKA_BROKERS and no REDIS_ADDR, -broker kafka -store redis runs
// on an in-process kfake cluster and miniredis, and says so.
func TestLabCommandEmbeddedKafkaAndRedis(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"-broker", "kafka", "-store", "redis", "-kafka-brokers", "", "-redis-addr", "",
		"-orders", "40", "-effect-time", "1ms", "-lose-acks", "3"}
	if code := run(args, &out, &errOut); code != 0 {
		t.Fatalf("dedup-lab exited %d\n%s%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{
		"broker: embedded Kafka (kfake) at 127.0.0.1:",
		"store:  embedded Redis (miniredis, in this process) at 127.0.0.1:",
		"(set REDIS_ADDR for a real server)",
		"lost acks: the first delivery of 3 messages is nacked after its charge",
		"(+3 redelivered after a lost ack): every copy charged again",
		"idempotency on:  41 charges for 41 distinct orders: every order charged exactly once",
		"broker: every message acked, none left waiting, in flight or uncommitted",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// closedEndpoint returns an http://127.0.0.1:port URL on which nothing
// listens.
func closedEndpoint(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return "http://" + addr
}

// When no emulator answers, the lab says how to start one, in one line.
func TestLabCommandHintsWhenNoEndpointAnswers(t *testing.T) {
	endpoint := closedEndpoint(t)
	t.Setenv("AWS_ENDPOINT_URL", endpoint)
	for _, s := range []string{"SQS", "SNS", "DYNAMODB"} {
		t.Setenv("AWS_ENDPOINT_URL_"+s, "")
	}
	for _, tc := range []struct {
		args []string
		hint string
	}{
		{[]string{"-broker", "sqs"}, "hint: start the local SQS/SNS emulator with `npm ci --prefix tools && node examples/sqs/fauxqs.mjs` (fauxqs on 127.0.0.1:4566)"},
		{[]string{"-broker", "sns"}, "hint: start the local SQS/SNS emulator with"},
		{[]string{"-store", "dynamo"}, "hint: start the local DynamoDB emulator with `npm ci --prefix tools && node tools/node_modules/dynalite/cli.js --host 127.0.0.1 --port 4567`"},
	} {
		var out, errOut bytes.Buffer
		if code := run(tc.args, &out, &errOut); code != 1 {
			t.Errorf("dedup-lab %v exited %d, want 1", tc.args, code)
		}
		lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
		if len(lines) != 2 || !strings.Contains(lines[0], endpoint) || !strings.HasPrefix(lines[1], tc.hint) {
			t.Errorf("dedup-lab %v printed\n%s\nwant an error naming %s and a line starting %q", tc.args, errOut.String(), endpoint, tc.hint)
		}
		if out.Len() != 0 {
			t.Errorf("dedup-lab %v printed to stdout:\n%s", tc.args, out.String())
		}
	}
}

// The AWS brokers and store found through the standard variables, on
// fauxqs and dynalite.
func TestLabCommandOnEmulators(t *testing.T) {
	fq, err := testserver.StartFauxqs()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fq.Close() })
	dyn, err := testserver.StartDynalite()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dyn.Close() })
	t.Setenv("AWS_ENDPOINT_URL", fq.Endpoint)
	t.Setenv("AWS_ENDPOINT_URL_DYNAMODB", dyn.Endpoint)

	var out, errOut bytes.Buffer
	args := []string{"-broker", "sns", "-store", "dynamo", "-orders", "30", "-effect-time", "1ms", "-lose-acks", "2"}
	if code := run(args, &out, &errOut); code != 0 {
		t.Fatalf("dedup-lab exited %d\n%s%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{
		"broker: SNS at " + fq.Endpoint + " fanning out to an SQS queue",
		"store:  DynamoDB at " + dyn.Endpoint + ", table dedup-lab",
		"idempotency on:  31 charges for 31 distinct orders: every order charged exactly once",
		"broker: every message acked, none left waiting, in flight or uncommitted",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	t.Log("\n" + out.String())
}

// runLab runs the command and checks its output holds want.
func runLab(t *testing.T, args []string, want ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := run(args, &out, &errOut); code != 0 {
		t.Fatalf("dedup-lab %v exited %d\n%s%s", args, code, out.String(), errOut.String())
	}
	for _, w := range want {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, out.String())
		}
	}
	return out.String()
}

// -broker redisstream -store redis with no REDIS_ADDR: one embedded Redis
// carries the stream and the records.
func TestLabCommandRedisStreamAndStoreOnOneEmbeddedRedis(t *testing.T) {
	out := runLab(t, []string{"-broker", "redisstream", "-store", "redis", "-redis-addr", "", "-orders", "40", "-effect-time", "1ms", "-lose-acks", "3"},
		"broker: Redis Streams on embedded Redis (miniredis, in this process) at 127.0.0.1:",
		`consumer group "charge-orders" of 8 consumers`,
		"(+3 redelivered after a lost ack): every copy charged again",
		"idempotency on:  41 charges for 41 distinct orders: every order charged exactly once",
		"broker: every message acked, none left waiting, in flight or uncommitted",
	)
	addr := regexp.MustCompile(`Redis Streams on embedded Redis \(miniredis, in this process\) at (127\.0\.0\.1:\d+)`).FindStringSubmatch(out)
	if addr == nil || !strings.Contains(out, "store:  embedded Redis (miniredis, in this process) at "+addr[1]) {
		t.Errorf("the stream and the store are not on one server:\n%s", out)
	}
}

// -broker nats with no NATS_URL: an embedded nats-server with JetStream.
func TestLabCommandEmbeddedNATS(t *testing.T) {
	t.Setenv("NATS_URL", "")
	runLab(t, []string{"-broker", "nats", "-store", "memory", "-nats-url", "", "-orders", "40", "-effect-time", "1ms", "-lose-acks", "3"},
		"broker: embedded NATS JetStream (nats-server, in this process) at nats://127.0.0.1:",
		"(+3 redelivered after a lost ack): every copy charged again",
		"idempotency on:  41 charges for 41 distinct orders: every order charged exactly once",
		"broker: every message acked, none left waiting, in flight or uncommitted",
	)
}

// -broker amqp on a RabbitMQ node the test starts; without AMQP_URL the
// lab says how to start one.
func TestLabCommandAMQP(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"-broker", "amqp", "-amqp-url", ""}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "hint: start RabbitMQ") {
		t.Errorf("without AMQP_URL: exit %d\n%s", code, errOut.String())
	}
	r, err := testserver.StartRabbitMQ()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	t.Logf("RabbitMQ node %s accepted AMQP connections after %v", r.NodeName, r.Startup)
	runLab(t, []string{"-broker", "amqp", "-amqp-url", r.URL, "-store", "redis", "-redis-addr", "", "-orders", "40", "-effect-time", "1ms", "-lose-acks", "3"},
		"broker: RabbitMQ at amqp://guest:xxxxx@127.0.0.1:",
		"(+3 redelivered after a lost ack): every copy charged again",
		"idempotency on:  41 charges for 41 distinct orders: every order charged exactly once",
		"broker: every message acked, none left waiting, in flight or uncommitted",
	)
}

// -idempotency shadow on a real redis-server: every copy charged (also the
// redelivered lost acks), the copies dedup would have skipped counted.
func TestLabCommandShadowOnRedis(t *testing.T) {
	r, err := testserver.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	out := runLab(t, []string{"-idempotency", "shadow", "-store", "redis", "-redis-addr", r.Addr,
		"-orders", "40", "-effect-time", "1ms", "-lose-acks", "3", "-seed", "3"})
	m := regexp.MustCompile(`(?m)^shadow\s+(\d+)\s+41\s+(\d+)\s+41\s+-\s+-\s+3$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no shadow row with 41 distinct orders, 41 claims won, 3 nacks (the lost acks):\n%s", out)
	}
	messages, charges := atoi(t, m[1]), atoi(t, m[2])
	if charges != messages+3 {
		t.Fatalf("shadow: %d charges for %d messages and 3 lost acks:\n%s", charges, messages, out)
	}
	want := fmt.Sprintf("idempotency shadow: %d charges for %d messages (+3 redelivered after a lost ack): every copy charged, as without dedup; would skip %d = %d messages + 3 lost acks - 41 distinct orders",
		messages+3, messages, messages+3-41, messages)
	if !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
