package dedup_test

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLogEventsOfARunWithDuplicates reads the text a standard Watermill logger
// writes for a run with known duplicates, a failing handler and a message
// without a key, and checks every event's count, level and fields.
func TestLogEventsOfARunWithDuplicates(t *testing.T) {
	var out syncBuffer
	logger := watermill.NewStdLoggerWithOut(&out, true, false)
	d, err := dedup.New(dedup.Config{Store: memstore.New(nil), Key: keyfuncs.JSON("order_id"), Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	poison, err := middleware.PoisonQueueWithFilter(pubSub, "orders.poison", dedup.IsPermanent)
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(poison, d.Middleware)
	var failedOnce atomic.Bool
	router.AddConsumerHandler("charge-orders", "orders", pubSub, func(m *message.Message) error {
		if failedOnce.CompareAndSwap(false, true) {
			return fmt.Errorf("gateway timeout")
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = router.Run(ctx) }()
	recv(t, "the router to start", router.Running())
	for range 3 {
		for i := range 4 {
			m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"order_id":"ORDER-%d"}`, i)))
			if err := pubSub.Publish("orders", m); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := pubSub.Publish("orders", message.NewMessage("no-key-msg", []byte(`{"amount":1}`))); err != nil {
		t.Fatal(err)
	}
	if err := router.Close(); err != nil {
		t.Fatal(err)
	}

	line := regexp.MustCompile(`level=(\w+)\s+msg="dedup: (\w+)" .*dedup_event=(\w+) `)
	counts := map[string]int{}
	levels := map[string]string{}
	for _, l := range bytes.Split([]byte(out.String()), []byte("\n")) {
		m := line.FindSubmatch(l)
		if m == nil {
			continue
		}
		event := string(m[3])
		if string(m[2]) != event {
			t.Errorf("message %q carries dedup_event=%s", m[2], event)
		}
		counts[event]++
		levels[event] = string(m[1])
		if !bytes.Contains(l, []byte("handler=charge-orders")) || !bytes.Contains(l, []byte("topic=orders")) || !bytes.Contains(l, []byte("message_uuid=")) {
			t.Errorf("event line lacks handler, topic or message uuid: %s", l)
		}
		if event != "key_missing" && !bytes.Contains(l, []byte("key=charge-orders:ORDER-")) {
			t.Errorf("event line lacks the scoped key: %s", l)
		}
	}
	want := map[string]struct {
		n     int
		level string
	}{
		"claim_won":      {5, "DEBUG"}, // 4 orders + the retry after the failure
		"completed":      {4, "DEBUG"},
		"released":       {1, "INFO"},
		"skip_duplicate": {8, "INFO"},
		"key_missing":    {1, "ERROR"},
	}
	for event, w := range want {
		if counts[event] != w.n || levels[event] != w.level {
			t.Errorf("%s: %d lines at %s, want %d at %s", event, counts[event], levels[event], w.n, w.level)
		}
	}
	if len(counts) != len(want) {
		t.Errorf("events logged: %v, want only %v", counts, want)
	}
	if t.Failed() {
		t.Log(out.String())
	}
}
