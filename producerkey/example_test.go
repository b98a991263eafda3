package producerkey_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/producerkey"
)

// flaky fails the first Publish after passing it on, as a broker whose
// acknowledgement is lost: the message is stored, the producer sees an
// error and retries.
type flaky struct {
	message.Publisher
	failed bool
}

func (f *flaky) Publish(topic string, msgs ...*message.Message) error {
	err := f.Publisher.Publish(topic, msgs...)
	if !f.failed {
		f.failed = true
		return errors.New("publish: i/o timeout")
	}
	return err
}

// A retried Publish of the same message carries the same key: the consumer
// (keyfuncs.Metadata(producerkey.DefaultMetadata)) skips the second copy.
func ExamplePublisher() {
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	pub, err := producerkey.NewPublisher(&flaky{Publisher: broker}, producerkey.PublisherConfig{})
	if err != nil {
		panic(err)
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"ORDER-003"}`))
	for attempt := 1; ; attempt++ {
		err := pub.Publish("orders", msg)
		fmt.Printf("attempt %d: %v\n", attempt, err)
		if err == nil {
			break
		}
	}
	copies, _ := broker.Subscribe(context.Background(), "orders")
	first, second := <-copies, <-copies
	key := keyfuncs.Metadata(producerkey.DefaultMetadata)
	k1, _ := key(first)
	k2, _ := key(second)
	fmt.Println("two copies, one key:", k1 == k2, len(k1))
	// Output:
	// attempt 1: publish: i/o timeout
	// attempt 2: <nil>
	// two copies, one key: true 32
}

// With a business key function, a message rebuilt for the retry (a new
// UUID) gets the same key too.
func ExamplePublisherConfig_key() {
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	pub, err := producerkey.NewPublisher(broker, producerkey.PublisherConfig{Key: keyfuncs.JSON("order_id")})
	if err != nil {
		panic(err)
	}
	for range 2 {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"ORDER-003"}`))
		if err := pub.Publish("orders", msg); err != nil {
			panic(err)
		}
		fmt.Println(msg.Metadata.Get(producerkey.DefaultMetadata))
	}
	// Output:
	// ORDER-003
	// ORDER-003
}

// Every attempt of one intent carries one Idempotency-Key; the next intent
// gets another.
func ExampleTransport() {
	var (
		mu   sync.Mutex
		keys []string
	)
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, r.Header.Get(producerkey.Header))
	}))
	defer server.Close()
	client := &http.Client{Transport: &producerkey.Transport{}}

	post := func(ctx context.Context) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, server.URL+"/payments", nil)
		resp, err := client.Do(req)
		if err != nil {
			panic(err)
		}
		_ = resp.Body.Close()
	}
	charge := producerkey.NewIntent(context.Background())
	post(charge)                                      // the first attempt
	post(charge)                                      // its retry
	post(producerkey.NewIntent(context.Background())) // another payment
	mu.Lock()
	defer mu.Unlock()
	fmt.Println("retry, same key:", keys[0] == keys[1])
	fmt.Println("next intent, new key:", keys[2] != keys[0])
	// Output:
	// retry, same key: true
	// next intent, new key: true
}
