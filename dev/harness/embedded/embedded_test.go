package embedded_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storetest"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/embedded"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// The embedded miniredis, with its INFO server answer and its clock driven
// by a ticker, is a faithful enough Redis for the store: the whole
// conformance suite passes on it, expiry included.
//
// Its clock is the wall clock, so the suite waits in real time, and
// ShortDuration is also the slack between two round trips: a claim taken
// with it must still be alive at the next one. The default 100ms is less
// than the stalls a busy 2-core machine under -race shows (up to a second):
// one second, as in the PostgreSQL suite, is the margin.
func TestMiniredisConformance(t *testing.T) {
	r, err := embedded.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	client := goredis.NewClient(&goredis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = client.Close() })
	store, err := dedupredis.New(context.Background(), dedupredis.Config{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	storetest.Run(t, func(t *testing.T) (dedup.Store, func(time.Duration)) {
		return store, nil
	}, storetest.Features{ShortDuration: time.Second, Fencing: true})
}

// A key set on the embedded Redis right after the server was busy for a
// while keeps its whole TTL: the server's clock does not charge it with the
// stall. A long Lua script holds miniredis' lock, as a burst of commands or
// a descheduled goroutine does on a busy machine.
func TestEmbeddedRedisDoesNotAgeANewKeyByAStall(t *testing.T) {
	r, err := embedded.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	client := goredis.NewClient(&goredis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = client.Close() })
	ctx := context.Background()
	start := time.Now()
	if err := client.Eval(ctx, "local i = 0 while i < 150000 do i = i + 1 end return i", nil).Err(); err != nil {
		t.Fatal(err)
	}
	stall := time.Since(start)
	const ttl = 10 * time.Second
	if err := client.Set(ctx, "fresh", "v", ttl).Err(); err != nil {
		t.Fatal(err)
	}
	// Commands that let the server's clock move on.
	for range 5 {
		time.Sleep(20 * time.Millisecond)
		if err := client.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	left, err := client.PTTL(ctx, "fresh").Result()
	if err != nil {
		t.Fatal(err)
	}
	// Well over the 100ms of pauses and round trips; well under any stall
	// worth the name.
	if aged := ttl - left; aged > time.Since(start)-stall+50*time.Millisecond {
		t.Errorf("a key set after a %v stall aged %v within %v: the stall was charged to it", stall.Round(time.Millisecond), aged.Round(time.Millisecond), (time.Since(start) - stall).Round(time.Millisecond))
	}
	t.Logf("stall %v, key aged %v", stall.Round(time.Millisecond), (ttl - left).Round(time.Millisecond))
}

// The embedded NATS server has JetStream on, and Close removes its store.
func TestNATSHasJetStream(t *testing.T) {
	n, err := embedded.StartNATS()
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	nc, err := nats.Connect(n.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AddStream(&nats.StreamConfig{Name: "orders", Subjects: []string{"orders"}}); err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish("orders", []byte("{}"))
	if err != nil || ack.Sequence != 1 {
		t.Fatalf("publish: %+v, %v", ack, err)
	}
}

// The embedded Kafka answers on its bootstrap address.
func TestKafkaListens(t *testing.T) {
	k, err := embedded.StartKafka(3)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if len(k.Addrs) != 1 {
		t.Fatalf("addresses %v", k.Addrs)
	}
}
