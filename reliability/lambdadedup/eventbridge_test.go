package lambdadedup_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
)

// invokeEventBridge sends an EventBridge event as JSON through the Lambda
// handler interface and returns the invocation's error.
func invokeEventBridge(t *testing.T, ctx context.Context, h *lambdadedup.Handler, id, detail string) error {
	t.Helper()
	payload, err := json.Marshal(events.EventBridgeEvent{
		Version: "0", ID: id, DetailType: "OrderPlaced", Source: "orders.service", AccountID: "000000000000",
		Time: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), Region: "us-east-1", Resources: []string{}, Detail: json.RawMessage(detail),
	})
	if err != nil {
		t.Fatal(err)
	}
	out, err := lambda.NewHandler(h.HandleEventBridge).Invoke(ctx, payload)
	if err == nil && string(out) != "null" {
		t.Fatalf("response %s, want null", out)
	}
	return err
}

func TestEventBridge(t *testing.T) {
	ctx := context.Background()
	for _, st := range realStores {
		t.Run(st.name, func(t *testing.T) {
			cfg := func() lambdadedup.Config {
				return lambdadedup.Config{Dedup: dedup.Config{Scope: "charge-orders-" + watermill.NewShortUUID(), Store: st.new(t)}}
			}
			t.Run("handler fails once, retry succeeds, one effect", func(t *testing.T) {
				c := newCharger()
				c.fail = func(_ string, call int) error {
					if call == 1 {
						return errors.New("gateway down")
					}
					return nil
				}
				h := newHandler(t, cfg(), c.handle)
				if err := invokeEventBridge(t, ctx, h, "ev-1", order("A")); err == nil {
					t.Error("first invocation: nil, want the handler's error (Lambda retries)")
				}
				if err := invokeEventBridge(t, ctx, h, "ev-1", order("A")); err != nil {
					t.Errorf("retry: %v", err)
				}
				if err := invokeEventBridge(t, ctx, h, "ev-2", order("A")); err != nil {
					t.Errorf("duplicate (another event id): %v", err)
				}
				if c.charges["A"] != 1 || len(c.calls) != 2 {
					t.Errorf("charges %v in %d calls, want A:1 in 2 calls", c.charges, len(c.calls))
				}
				t.Logf("%s: %d charge for 3 invocations (failed, retried, duplicate)", st.name, c.total())
			})
			t.Run("transport key fails, dropped with DropPermanent", func(t *testing.T) {
				c := newCharger()
				conf := cfg()
				h := newHandler(t, conf, c.handle)
				detail := `{"order_id":"ev-9"}`
				if err := invokeEventBridge(t, ctx, h, "ev-9", detail); err == nil {
					t.Error("nil, want an error (ErrTransportKey)")
				}
				conf.DropPermanent = true
				h = newHandler(t, conf, c.handle)
				if err := invokeEventBridge(t, ctx, h, "ev-9", detail); err != nil {
					t.Errorf("DropPermanent: %v", err)
				}
				if c.total() != 0 {
					t.Errorf("charged %v", c.charges)
				}
			})
			t.Run("in progress fails", func(t *testing.T) {
				conf := cfg()
				if _, err := conf.Dedup.Store.Claim(ctx, admin.ScopedKey(conf.Dedup.Scope, "A"), "", time.Minute); err != nil {
					t.Fatal(err)
				}
				c := newCharger()
				h := newHandler(t, conf, c.handle)
				if err := invokeEventBridge(t, ctx, h, "ev-1", order("A")); err == nil {
					t.Error("nil, want an error (ErrInProgress)")
				}
				if c.total() != 0 {
					t.Errorf("charged %v", c.charges)
				}
			})
		})
	}
}

// The key function sees the same key via the handler's direct path: the
// error returned for a transport key is ErrTransportKey.
func TestEventBridgeErrors(t *testing.T) {
	c := newCharger()
	h := newHandler(t, lambdadedup.Config{}, c.handle)
	err := h.HandleEventBridge(context.Background(), events.EventBridgeEvent{ID: "ev-1", Detail: json.RawMessage(`{"order_id":"ev-1"}`)})
	if !errors.Is(err, dedup.ErrTransportKey) {
		t.Errorf("%v, want ErrTransportKey", err)
	}
	err = h.HandleEventBridge(context.Background(), events.EventBridgeEvent{ID: "ev-2", Detail: json.RawMessage(`{"amount":1}`)})
	if !errors.Is(err, dedup.ErrNoKey) {
		t.Errorf("%v, want ErrNoKey", err)
	}
}

// A DynamoDB stream record as AWS sends it (JSON) becomes the plain JSON
// item keyfuncs.JSON reads.
func TestDynamoDBMessage(t *testing.T) {
	raw := `{"eventID":"e1","eventName":"INSERT","eventSource":"aws:dynamodb","dynamodb":{
		"Keys":{"order_id":{"S":"ORDER-1"}},
		"NewImage":{"order_id":{"S":"ORDER-1"},"amount":{"N":"150.50"},"paid":{"BOOL":true},"note":{"NULL":true},
			"lines":{"L":[{"M":{"sku":{"S":"X"},"qty":{"N":"2"}}}]},"tags":{"SS":["a","b"]},"sizes":{"NS":["1","2.5"]},
			"blob":{"B":"AAE="},"blobs":{"BS":["AAE="]}},
		"SequenceNumber":"111","SizeBytes":26,"StreamViewType":"NEW_IMAGE"}}`
	var rec events.DynamoDBEventRecord
	if err := json.Unmarshal([]byte(raw), &rec); err != nil {
		t.Fatal(err)
	}
	msg, err := lambdadedup.DynamoDBMessage(rec)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"amount":150.50,"blob":"AAE=","blobs":["AAE="],"lines":[{"qty":2,"sku":"X"}],"note":null,"order_id":"ORDER-1","paid":true,"sizes":[1,2.5],"tags":["a","b"]}`
	if string(msg.Payload) != want || msg.UUID != "e1" {
		t.Errorf("payload %s uuid %q\nwant    %s uuid e1", msg.Payload, msg.UUID, want)
	}
	if k, err := keyfuncs.JSON("order_id")(msg); err != nil || k != "ORDER-1" {
		t.Errorf("key %q %v", k, err)
	}
	// REMOVE: no NewImage, the keys.
	rec.Change.NewImage = nil
	if msg, err = lambdadedup.DynamoDBMessage(rec); err != nil || string(msg.Payload) != `{"order_id":"ORDER-1"}` {
		t.Errorf("keys only: %s %v", msg.Payload, err)
	}
	rec.Change.Keys = nil
	if _, err = lambdadedup.DynamoDBMessage(rec); err == nil {
		t.Error("no image, no keys: nil error")
	}
}

// A record handled by each Lambda source is a duplicate for a Watermill
// router on the same Redis store and scope, and the other way round.
func TestStreamsAcrossRuntimes(t *testing.T) {
	type source struct {
		name   string
		invoke func(t *testing.T, ctx context.Context, h *lambdadedup.Handler, seq, orderID string) bool // ok
	}
	var sources []source
	for _, s := range streams {
		sources = append(sources, source{s.name, func(t *testing.T, ctx context.Context, h *lambdadedup.Handler, seq, orderID string) bool {
			return len(s.invoke(t, ctx, h, streamRec{seq, orderID})) == 0
		}})
	}
	sources = append(sources, source{"eventbridge", func(t *testing.T, ctx context.Context, h *lambdadedup.Handler, seq, orderID string) bool {
		return invokeEventBridge(t, ctx, h, "ev-"+seq, order(orderID)) == nil
	}})
	for _, src := range sources {
		t.Run(src.name, func(t *testing.T) {
			scope := "charge-orders-" + watermill.NewShortUUID()
			shared := dedup.Config{Store: newRedisStore(t), Key: keyfuncs.JSON("order_id"), Scope: scope}
			c := newCharger()
			lh, err := lambdadedup.New(lambdadedup.Config{Dedup: shared}, c.handle)
			if err != nil {
				t.Fatal(err)
			}
			d, err := dedup.New(shared)
			if err != nil {
				t.Fatal(err)
			}
			pubsub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			acked := make(chan string, 10)
			router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
				return func(msg *message.Message) ([]*message.Message, error) {
					out, err := h(msg)
					if err == nil {
						id, _ := keyfuncs.JSON("order_id")(msg)
						acked <- id
					}
					return out, err
				}
			})
			router.AddMiddleware(d.Middleware)
			router.AddConsumerHandler("charge-orders", "orders", pubsub, c.handle)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { _ = router.Run(ctx) }()
			defer func() { _ = router.Close() }()
			select {
			case <-router.Running():
			case <-time.After(time.Minute):
				t.Fatal("the router did not start within a minute")
			}
			publish := func(id string) {
				t.Helper()
				if err := pubsub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(order(id)))); err != nil {
					t.Fatal(err)
				}
				select {
				case got := <-acked:
					if got != id {
						t.Fatalf("router acked %s, want %s", got, id)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("timed out after 10s waiting for the router to ack %s", id)
				}
			}
			if !src.invoke(t, ctx, lh, "1", "ORDER-L") {
				t.Fatal("lambda failed ORDER-L")
			}
			publish("ORDER-L")
			publish("ORDER-R")
			if !src.invoke(t, ctx, lh, "2", "ORDER-R") {
				t.Fatal("lambda failed ORDER-R")
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.charges["ORDER-L"] != 1 || c.charges["ORDER-R"] != 1 || len(c.calls) != 2 {
				t.Errorf("charges %v in %d calls, want each order once across both runtimes", c.charges, len(c.calls))
			}
		})
	}
}
