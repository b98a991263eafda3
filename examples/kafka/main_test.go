package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

// Kafka is an in-process kfake cluster per test (the Kafka protocol, spoken
// to by Sarama), as the example starts without KAFKA_BROKERS; the store is a
// real redis-server on a free loopback port.
var redisAddr string

func TestMain(m *testing.M) {
	testserver.Main(m, func() (func(), error) {
		r, err := testserver.StartRedis()
		if err != nil {
			return nil, err
		}
		redisAddr = r.Addr
		return func() { _ = r.Close() }, nil
	})
}

func startKafka(t *testing.T) *cluster {
	t.Helper()
	k, err := connectKafka("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.close)
	return k
}

func testConfig(t *testing.T, extra ...string) config {
	t.Helper()
	id := strings.ToLower(watermill.NewShortUUID())
	args := append([]string{"-redis-addr", redisAddr, "-scope", "charge-order-" + id, "-timeout", "90s"}, extra...)
	cfg, err := parseFlags(args, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The demo: 8 messages of 3 orders (keys from headers and bodies, one first
// charge failing) consumed by a group of two: each order charged once, the
// rest acked as duplicates, every offset committed.
func TestDemoChargesEachOrderOnce(t *testing.T) {
	for _, embedded := range []bool{true, false} {
		t.Run(fmt.Sprintf("embedded Redis %v", embedded), func(t *testing.T) {
			t.Parallel()
			k := startKafka(t)
			var out bytes.Buffer
			w := lockWriter(&out)
			l, p := newLedger(w), newPrinter(w)
			cfg := testConfig(t)
			if embedded {
				cfg.redisAddr = ""
			}
			err := runWith(context.Background(), cfg, k, demoOrders, l, p, w)
			t.Log("\n" + out.String())
			if err != nil {
				t.Fatal(err)
			}
			if summary, charges := l.summary(); charges != 3 || summary != "ORDER-001 x1, ORDER-003 x1, ORDER-004 x1" {
				t.Errorf("%d charges: %s", charges, summary)
			}
			// The key from the header and the key from the body are the
			// same key: ORDER-003's five copies, with and without header,
			// give one charge.
			if won, rel, dup := p.count(event.ClaimWon), p.count(event.Released), p.count(event.SkipDuplicate); won != 4 || rel != 1 || dup != 5 {
				t.Errorf("claims won %d, released %d, duplicates skipped %d; want 4, 1, 5", won, rel, dup)
			}
			for _, want := range []string{
				"published ORDER-003 x3 with header order_id",
				"published ORDER-003 x2 without header",
				"8 messages, 3 distinct orders, 3 charges: ORDER-001 x1, ORDER-003 x1, ORDER-004 x1",
				"every offset committed",
			} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q", want)
				}
			}
		})
	}
}

func TestDemoWithoutIdempotencyChargesEveryCopy(t *testing.T) {
	t.Parallel()
	k := startKafka(t)
	var out bytes.Buffer
	w := lockWriter(&out)
	l := newLedger(w)
	cfg := testConfig(t, "-idempotency=false")
	err := runWith(context.Background(), cfg, k, demoOrders, l, newPrinter(w), w)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if summary, charges := l.summary(); charges != 8 || summary != "ORDER-001 x1, ORDER-003 x5, ORDER-004 x2" {
		t.Errorf("%d charges: %s", charges, summary)
	}
}

// Two subscribers in one consumer group, four partitions, and the copies of
// each order spread over consecutive partitions (round-robin), so many
// orders have copies on partitions owned by different members, consumed
// concurrently: every order is charged exactly once, and both members
// charge.
func TestConsumerGroupOfTwoChargesEachOrderOnce(t *testing.T) {
	t.Parallel()
	k := startKafka(t)
	k.partitioner = sarama.NewRoundRobinPartitioner
	rng := rand.New(rand.NewPCG(42, 7))
	var orders []publication
	messages := 0
	for i := range 60 {
		copies := 1 + rng.IntN(4)
		orders = append(orders, publication{
			order:  order{fmt.Sprintf("ORDER-%04d", i), 10 + rng.IntN(90), "BRL"},
			copies: copies, header: i%2 == 0,
		})
		messages += copies
	}
	var out bytes.Buffer
	w := lockWriter(&out)
	l, p := newLedger(w), newPrinter(w)
	cfg := testConfig(t, "-members", "2", "-partitions", "4")
	if err := runWith(context.Background(), cfg, k, orders, l, p, w); err != nil {
		t.Log("\n" + out.String())
		t.Fatal(err)
	}
	summary, charges := l.summary()
	if charges != len(orders) {
		t.Errorf("%d charges for %d orders (%d messages): %s", charges, len(orders), messages, summary)
	}
	l.mu.Lock()
	for id, n := range l.charges {
		if n != 1 {
			t.Errorf("%s charged %d times", id, n)
		}
	}
	if len(l.byMember) != 2 || l.byMember["member-1"] == 0 || l.byMember["member-2"] == 0 {
		t.Errorf("charges per member: %v, want both members charging", l.byMember)
	}
	l.mu.Unlock()
	if won, dup := p.count(event.ClaimWon), p.count(event.SkipDuplicate); won != len(orders) || dup < messages-len(orders) {
		t.Errorf("claims won %d, duplicates skipped %d; want %d, at least %d", won, dup, len(orders), messages-len(orders))
	}
	spread := p.spread()
	if len(spread) == 0 {
		t.Error("no order had copies handled by both members")
	}
	t.Logf("%d messages of %d orders; copies of %d orders handled by both members; charges per member %v; in progress %d",
		messages, len(orders), len(spread), l.byMember, p.count(event.InProgress))
}
