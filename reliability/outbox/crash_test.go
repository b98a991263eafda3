package outbox_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dev/harness/kafkabroker"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/crashtest"
)

// Environment of a shop running in a child process: its parent's
// PostgreSQL (envDSN), schema and Kafka, and where it stops.
const (
	envSchema = "OUTBOX_TEST_SCHEMA"
	envKafka  = "OUTBOX_TEST_KAFKA"
	envHook   = "OUTBOX_TEST_HOOK"
)

// childLease is the shop's lease: a consumer killed while holding a key
// holds it this long.
const childLease = 3 * time.Second

var orderIDs = []string{"ORDER-1", "ORDER-2", "ORDER-3"}

// runShopChild runs the shop in a child process, stopping (and reporting)
// where envHook says, until the parent kills it.
func runShopChild(t *testing.T) {
	s := openShop(t, os.Getenv(envSchema), false)
	k := &kafkabroker.Kafka{Brokers: strings.Split(os.Getenv(envKafka), ",")}
	var h hooks
	switch os.Getenv(envHook) {
	case "before-publish":
		h.beforePublish = func() { crashtest.Reach("publishing") }
	case "after-effect":
		h.afterEffect = func(string) { crashtest.Reach("effect-written") }
	case "after-publish":
		h.afterPublish = func() { crashtest.Reach("published") }
	}
	t.Fatalf("the shop stopped: %v", s.run(context.Background(), k, childLease, h))
}

func startShop(t *testing.T, s *shop, k *kafkabroker.Kafka, hook string) *crashtest.Child {
	t.Helper()
	return crashtest.Start(t, []string{envDSN + "=" + dsn, envSchema + "=" + s.schema,
		envKafka + "=" + strings.Join(k.Brokers, ","), envHook + "=" + hook})
}

// finished: every order's key is completed and the forwarder has
// acknowledged every message of the outbox.
func finished(st state) bool {
	for _, id := range orderIDs {
		if st.keys[id] != "completed" {
			return false
		}
	}
	return st.pending == 0
}

// exactlyOnce checks one row per order, and one payment event per order
// except those listed in twice, which must have two.
func exactlyOnce(t *testing.T, st state, twice ...string) {
	t.Helper()
	total := 0
	for _, id := range orderIDs {
		events := 1
		if slices.Contains(twice, id) {
			events = 2
		}
		total += events
		if st.rows[id] != 1 || st.events[id] != events {
			t.Fatalf("%s: %d rows and %d events, want 1 and %d (%v)", id, st.rows[id], st.events[id], events, st)
		}
	}
	if st.eventTotal != total {
		t.Fatalf("%d events on Kafka, want %d (%v)", st.eventTotal, total, st)
	}
}

// killShop publishes the orders, runs the shop in a child process that
// stops at hook, kills it there (SIGKILL) when it reports point, and
// returns what survived.
func killShop(t *testing.T, hook, point string) (*shop, *kafkabroker.Kafka, state) {
	t.Helper()
	k := startKafka(t)
	s := openShop(t, newSchema(t), true)
	publishOrders(t, k, orderIDs...)
	child := startShop(t, s, k, hook)
	child.Wait(t, point)
	child.Kill(t)
	return s, k, s.state(t, k)
}

// restartShop runs the shop again in a new child process until every order
// is completed and delivered, kills it, and checks one row and one event
// per order.
func restartShop(t *testing.T, s *shop, k *kafkabroker.Kafka, twice ...string) state {
	t.Helper()
	restarted := startShop(t, s, k, "")
	s.waitFor(t, k, "every order completed and the outbox delivered", finished)
	restarted.Kill(t)
	final := s.state(t, k)
	exactlyOnce(t, final, twice...)
	return final
}

// TestKillBetweenCommitAndPublish: the shop commits orders (row, completed
// key and payment event in the outbox, one transaction each) and is killed
// (SIGKILL, a real child process) when its forwarder is about to publish
// the first event to Kafka. After a restart, every event is published
// exactly once.
func TestKillBetweenCommitAndPublish(t *testing.T) {
	if crashtest.IsChild(t) {
		runShopChild(t)
	}
	s, k, killed := killShop(t, "before-publish", "publishing")
	committed := 0
	for _, id := range orderIDs {
		if killed.keys[id] == "completed" {
			committed++
			if killed.rows[id] != 1 {
				t.Fatalf("%s completed with %d rows at the kill (%v)", id, killed.rows[id], killed)
			}
		}
	}
	if committed == 0 || killed.pending != int64(committed) || killed.eventTotal != 0 {
		t.Fatalf("at the kill: %v; want committed orders, each with its event waiting in the outbox, and no event on Kafka", killed)
	}
	final := restartShop(t, s, k)
	t.Logf("killed between COMMIT and publish: %d orders committed, %d events in the outbox, 0 on Kafka; after the restart: %v",
		committed, killed.pending, final)
}

// TestKillBetweenEffectAndCommit: the shop writes the first order's row in
// its transaction and is killed before COMMIT. Nothing of it survives: no
// row, no event, the key in progress. After a restart, the redelivered
// order waits out the dead consumer's lease, then runs once: one row, one
// event per order.
func TestKillBetweenEffectAndCommit(t *testing.T) {
	if crashtest.IsChild(t) {
		runShopChild(t)
	}
	s, k, killed := killShop(t, "after-effect", "effect-written")
	if len(killed.rows) != 0 || killed.pending != 0 || killed.eventTotal != 0 || killed.keys["ORDER-1"] != "in_progress" {
		t.Fatalf("at the kill: %v; want no row, no event, ORDER-1 in progress", killed)
	}
	final := restartShop(t, s, k)
	t.Logf("killed between the effect and COMMIT: %v; after the restart: %v", killed, final)
}

// TestKillBetweenPublishAndAck shows the forwarder's limit: killed after
// Kafka accepted the first event and before the forwarder recorded it, the
// restarted forwarder publishes that event again. Exactly that event is on
// Kafka twice; every other once; every row once. Consumers of the events
// deduplicate them by key.
func TestKillBetweenPublishAndAck(t *testing.T) {
	if crashtest.IsChild(t) {
		runShopChild(t)
	}
	s, k, killed := killShop(t, "after-publish", "published")
	if killed.eventTotal != 1 || killed.pending < 1 {
		t.Fatalf("at the kill: %v; want one event on Kafka, still pending in the outbox", killed)
	}
	var first string
	for id := range killed.events {
		first = id
	}
	final := restartShop(t, s, k, first)
	t.Logf("killed between Kafka's acknowledgement and the forwarder's: %v; after the restart: %v", killed, final)
}
