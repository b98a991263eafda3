package brokers_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storetest"
	"github.com/watermill-dedup/watermill-dedup/internal/brokers"
	"github.com/watermill-dedup/watermill-dedup/internal/testserver"
	redisstore "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

var fauxqsEndpoint string

func TestMain(m *testing.M) {
	testserver.Main(m, func() (func(), error) {
		fq, err := testserver.StartFauxqs()
		if err != nil {
			return nil, err
		}
		fauxqsEndpoint = fq.Endpoint
		return func() { _ = fq.Close() }, nil
	})
}

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
	r, err := brokers.StartMiniredis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	store, err := r.Store(context.Background(), redisstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	storetest.Run(t, func(t *testing.T) (dedup.Store, func(time.Duration)) {
		return store, nil
	}, storetest.Features{ShortDuration: time.Second})
}

// A key set on the embedded Redis right after the server was busy for a
// while keeps its whole TTL: the server's clock does not charge it with the
// stall. A long Lua script holds miniredis' lock, as a burst of commands or
// a descheduled goroutine does on a busy machine.
func TestEmbeddedRedisDoesNotAgeANewKeyByAStall(t *testing.T) {
	r, err := brokers.StartMiniredis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	ctx := context.Background()
	start := time.Now()
	if err := r.Client.Eval(ctx, "local i = 0 while i < 150000 do i = i + 1 end return i", nil).Err(); err != nil {
		t.Fatal(err)
	}
	stall := time.Since(start)
	const ttl = 10 * time.Second
	if err := r.Client.Set(ctx, "fresh", "v", ttl).Err(); err != nil {
		t.Fatal(err)
	}
	// Commands that let the server's clock move on.
	for range 5 {
		time.Sleep(20 * time.Millisecond)
		if err := r.Client.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	left, err := r.Client.PTTL(ctx, "fresh").Result()
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

func TestConnectRedisEmbeddedOrAddress(t *testing.T) {
	r, err := brokers.ConnectRedis("")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !r.Embedded || r.Client.Ping(context.Background()).Err() != nil {
		t.Fatalf("ConnectRedis(\"\"): embedded %v, ping %v", r.Embedded, r.Client.Ping(context.Background()).Err())
	}
	for addr, want := range map[string]string{
		"127.0.0.1:6390":            "127.0.0.1:6390",
		"redis://127.0.0.1:6391/2":  "127.0.0.1:6391",
		"  10.1.2.3:6379  ":         "10.1.2.3:6379",
		"rediss://cache.local:6380": "cache.local:6380",
	} {
		r, err := brokers.ConnectRedis(addr)
		if err != nil {
			t.Fatalf("ConnectRedis(%q): %v", addr, err)
		}
		if r.Embedded || r.Addr != want {
			t.Errorf("ConnectRedis(%q): embedded %v, addr %q, want %q", addr, r.Embedded, r.Addr, want)
		}
		r.Close()
	}
	if _, err := brokers.ConnectRedis("redis://[bad"); err == nil {
		t.Error("ConnectRedis accepted a malformed URL")
	}
}

func TestConnectKafkaList(t *testing.T) {
	k, err := brokers.ConnectKafka(" a:9092, b:9092 ,,", 1)
	if err != nil {
		t.Fatal(err)
	}
	if k.Embedded || len(k.Brokers) != 2 || k.Brokers[0] != "a:9092" || k.Brokers[1] != "b:9092" {
		t.Fatalf("ConnectKafka: %+v", k)
	}
	k.Close() // nothing to stop
}

// clearAWSEnv unsets every variable LoadAWS looks at.
func clearAWSEnv(t *testing.T) {
	for _, v := range []string{"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL_SNS", "AWS_ENDPOINT_URL_DYNAMODB",
		"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"} {
		t.Setenv(v, "")
	}
	// Tests touch loopback addresses only: no EC2 instance metadata lookup.
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
}

func TestLoadAWSLocalConveniences(t *testing.T) {
	ctx := context.Background()
	clearAWSEnv(t)
	t.Setenv("AWS_ENDPOINT_URL", "http://localhost:4566")
	t.Setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:4567")
	a, err := brokers.LoadAWS(ctx, "sqs", "sns", "dynamodb")
	if err != nil {
		t.Fatal(err)
	}
	if !a.Local || a.Config.Region != "us-east-1" {
		t.Errorf("local: %v, region %q", a.Local, a.Config.Region)
	}
	if a.Endpoint("sqs") != "http://localhost:4566" || a.Endpoint("dynamodb") != "http://127.0.0.1:4567" {
		t.Errorf("endpoints: sqs %q, dynamodb %q", a.Endpoint("sqs"), a.Endpoint("dynamodb"))
	}
	creds, err := a.Config.Credentials.Retrieve(ctx)
	if err != nil || creds.AccessKeyID != "test" {
		t.Errorf("credentials %+v, %v", creds, err)
	}

	// A region and keys that are set are kept.
	t.Setenv("AWS_REGION", "eu-west-1")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	a, err = brokers.LoadAWS(ctx, "sqs")
	if err != nil {
		t.Fatal(err)
	}
	creds, err = a.Config.Credentials.Retrieve(ctx)
	if a.Config.Region != "eu-west-1" || err != nil || creds.AccessKeyID != "AKIAEXAMPLE" {
		t.Errorf("region %q, credentials %+v, %v", a.Config.Region, creds, err)
	}
}

func TestLoadAWSRemote(t *testing.T) {
	ctx := context.Background()
	clearAWSEnv(t)
	// No endpoint and no region: AWS, but where?
	if _, err := brokers.LoadAWS(ctx, "sqs"); err == nil {
		t.Error("LoadAWS without a region or an endpoint succeeded")
	}
	// An endpoint that is not on this machine is not an emulator: no
	// default region, no made-up credentials.
	t.Setenv("AWS_ENDPOINT_URL", "https://sqs.example.com")
	t.Setenv("AWS_REGION", "sa-east-1")
	a, err := brokers.LoadAWS(ctx, "sqs")
	if err != nil {
		t.Fatal(err)
	}
	if a.Local {
		t.Error("a remote endpoint counts as local")
	}
	if _, err := a.Config.Credentials.Retrieve(ctx); err == nil {
		t.Error("credentials were made up for a remote endpoint")
	}
	// One local service and one remote: not local.
	t.Setenv("AWS_ENDPOINT_URL_SQS", "http://127.0.0.1:4566")
	if a, err := brokers.LoadAWS(ctx, "sqs", "sns"); err != nil || a.Local {
		t.Errorf("mixed endpoints: local %v, %v", a != nil && a.Local, err)
	}
}

func TestPingNamesEndpointAndHint(t *testing.T) {
	clearAWSEnv(t)
	t.Setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
	a, err := brokers.LoadAWS(context.Background(), "sqs", "sns", "dynamodb")
	if err != nil {
		t.Fatal(err)
	}
	for name, ping := range map[string]func(context.Context) error{"sqs": a.PingSQS, "sns": a.PingSNS, "dynamodb": a.PingDynamoDB} {
		err := ping(context.Background())
		var ue *brokers.UnreachableError
		if !errors.As(err, &ue) || ue.Service != name || ue.Endpoint != "http://127.0.0.1:1" || ue.Hint == "" {
			t.Errorf("ping %s: %v", name, err)
		}
	}
	t.Setenv("AWS_ENDPOINT_URL", fauxqsEndpoint)
	a, err = brokers.LoadAWS(context.Background(), "sqs", "sns")
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(a.PingSQS(context.Background()), a.PingSNS(context.Background())); err != nil {
		t.Fatal(err)
	}
}

func TestSNSMarshalerPublishesWithTopicArn(t *testing.T) {
	msg := message.NewMessage("uuid-1", []byte(`{"order_id":"ORDER-003"}`))
	msg.Metadata.Set("order_id", "ORDER-003")
	msg.Metadata.Set(brokers.MetaSQSReceiptHandle, "receipt")
	msg.Metadata.Set(brokers.MetaSQSMessageID, "sqs-id")
	msg.Metadata.Set(brokers.MetaSQSQueueURL, "http://queue")
	in := brokers.SNSMarshaler{}.Marshal("arn:aws:sns:us-east-1:000000000000:orders", msg)
	if aws.ToString(in.TopicArn) != "arn:aws:sns:us-east-1:000000000000:orders" || in.TargetArn != nil {
		t.Errorf("TopicArn %q, TargetArn %v", aws.ToString(in.TopicArn), in.TargetArn)
	}
	if aws.ToString(in.Message) != `{"order_id":"ORDER-003"}` {
		t.Errorf("Message %q", aws.ToString(in.Message))
	}
	if len(in.MessageAttributes) != 2 || aws.ToString(in.MessageAttributes["order_id"].StringValue) != "ORDER-003" ||
		aws.ToString(in.MessageAttributes[wsqs.UUIDAttribute].StringValue) != "uuid-1" {
		t.Errorf("attributes %v", in.MessageAttributes)
	}
	if len(msg.Metadata) != 4 {
		t.Errorf("the marshaler changed the message's metadata: %v", msg.Metadata)
	}
	out, err := brokers.SQSMarshaler{}.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.MessageAttributes) != 2 {
		t.Errorf("SQS attributes %v", out.MessageAttributes)
	}
}

func localAWS(t *testing.T) *brokers.AWS {
	t.Helper()
	clearAWSEnv(t)
	t.Setenv("AWS_ENDPOINT_URL", fauxqsEndpoint)
	a, err := brokers.LoadAWS(context.Background(), "sqs", "sns")
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func receive(t *testing.T, ch <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(30 * time.Second):
		t.Fatal("no message within 30s")
		return nil
	}
}

// Republishing one event through SNS delivers it to the queue again with a
// new SQS MessageId each time: the transport id changes, the business
// payload and metadata do not.
func TestSNSFanOutGivesEachPublishANewMessageID(t *testing.T) {
	a := localAWS(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	arn, err := a.CreateTopic(ctx, "brokers-test-fanout")
	if err != nil {
		t.Fatal(err)
	}
	sub, url, err := a.SNSSubscriber(ctx, arn, "brokers-test-fanout-q", brokers.QueueOptions{WaitTime: time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	pub, err := a.SNSPublisher(watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := sub.Subscribe(ctx, arn)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for i := range 3 {
		event := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"ORDER-003"}`))
		event.Metadata.Set("order_id", "ORDER-003")
		if err := pub.Publish(arn, event); err != nil {
			t.Fatal(err)
		}
		got := receive(t, ch)
		if string(got.Payload) != `{"order_id":"ORDER-003"}` || got.Metadata.Get("order_id") != "ORDER-003" || got.UUID != event.UUID {
			t.Errorf("copy %d: payload %s, metadata %v, uuid %s (published %s)", i, got.Payload, got.Metadata, got.UUID, event.UUID)
		}
		if got.Metadata.Get(brokers.MetaSQSQueueURL) != url || got.Metadata.Get(brokers.MetaSQSReceiptHandle) == "" {
			t.Errorf("copy %d: SQS metadata %v", i, got.Metadata)
		}
		ids[got.Metadata.Get(brokers.MetaSQSMessageID)] = true
		got.Ack()
	}
	if len(ids) != 3 || ids[""] {
		t.Errorf("SQS MessageIds of three publishes: %v", ids)
	}
}

// A nacked message stays hidden for the queue's visibility timeout;
// RetryAfter(0) makes it visible again at once: the subscriber, still
// running, receives it again well within the one-minute timeout. Without
// it, the queue's counts show the message in flight.
//
// The subscriber stays open until the outcome is read. Closing it first
// raced: watermill-aws' receive loop may start one more long poll as it
// closes, and the server keeps that poll waiting after the client gives up,
// so the message RetryAfter made visible went to that dead poll (in flight
// again) before the counts were read.
func TestRetryAfterMakesANackedMessageVisible(t *testing.T) {
	a := localAWS(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		retry bool
	}{
		{"without", false},
		{"with", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			queue := "brokers-test-retry-" + tc.name
			sub, url, err := a.SQSSubscriber(ctx, queue, brokers.QueueOptions{VisibilityTimeout: time.Minute, WaitTime: time.Second}, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = a.DeleteQueue(ctx, url) }()
			defer func() { _ = sub.Close() }()
			pub, err := a.SQSPublisher(watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			published := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
			if err := pub.Publish(queue, published); err != nil {
				t.Fatal(err)
			}
			ch, err := sub.Subscribe(ctx, queue)
			if err != nil {
				t.Fatal(err)
			}
			msg := receive(t, ch)
			h := func(*message.Message) ([]*message.Message, error) { return nil, errors.New("charge failed") }
			if tc.retry {
				h = a.RetryAfter(0)(h)
			}
			if _, err := h(msg); err == nil {
				t.Fatal("the middleware swallowed the error")
			}
			msg.Nack()
			if tc.retry {
				// Redelivered at once: receive waits 30s, half the
				// visibility timeout.
				again := receive(t, ch)
				if again.UUID != published.UUID {
					t.Errorf("received %s, want the nacked message %s again", again.UUID, published.UUID)
				}
				again.Ack()
				return
			}
			visible, hidden, _, err := a.QueueDepth(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			if visible != 0 || hidden != 1 {
				t.Errorf("visible %d, in flight %d; want 0, 1 (hidden for the visibility timeout)", visible, hidden)
			}
		})
	}
}
