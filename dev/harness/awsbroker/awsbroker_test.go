package awsbroker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/watermill-dedup/watermill-dedup/cmd/dedupctl/env/awsenv"
	"github.com/watermill-dedup/watermill-dedup/dev/harness/awsbroker"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
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

func TestPingNamesEndpointAndHint(t *testing.T) {
	clearAWSEnv(t)
	t.Setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
	a, err := awsenv.LoadAWS(context.Background(), "sqs", "sns")
	if err != nil {
		t.Fatal(err)
	}
	b := awsbroker.New(a)
	for name, ping := range map[string]func(context.Context) error{"sqs": b.PingSQS, "sns": b.PingSNS} {
		err := ping(context.Background())
		var ue *awsenv.UnreachableError
		if !errors.As(err, &ue) || ue.Service != name || ue.Endpoint != "http://127.0.0.1:1" || ue.Hint != awsenv.FauxqsHint {
			t.Errorf("ping %s: %v", name, err)
		}
	}
	b = localAWS(t)
	if err := errors.Join(b.PingSQS(context.Background()), b.PingSNS(context.Background())); err != nil {
		t.Fatal(err)
	}
}

func TestSNSMarshalerPublishesWithTopicArn(t *testing.T) {
	msg := message.NewMessage("uuid-1", []byte(`{"order_id":"ORDER-003"}`))
	msg.Metadata.Set("order_id", "ORDER-003")
	msg.Metadata.Set(awsbroker.MetaSQSReceiptHandle, "receipt")
	msg.Metadata.Set(awsbroker.MetaSQSMessageID, "sqs-id")
	msg.Metadata.Set(awsbroker.MetaSQSQueueURL, "http://queue")
	in := awsbroker.SNSMarshaler{}.Marshal("arn:aws:sns:us-east-1:000000000000:orders", msg)
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
	out, err := awsbroker.SQSMarshaler{}.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.MessageAttributes) != 2 {
		t.Errorf("SQS attributes %v", out.MessageAttributes)
	}
}

func localAWS(t *testing.T) *awsbroker.Broker {
	t.Helper()
	clearAWSEnv(t)
	t.Setenv("AWS_ENDPOINT_URL", fauxqsEndpoint)
	a, err := awsenv.LoadAWS(context.Background(), "sqs", "sns")
	if err != nil {
		t.Fatal(err)
	}
	return awsbroker.New(a)
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
	arn, err := a.CreateTopic(ctx, "awsbroker-test-fanout")
	if err != nil {
		t.Fatal(err)
	}
	sub, url, err := a.SNSSubscriber(ctx, arn, "awsbroker-test-fanout-q", awsbroker.QueueOptions{WaitTime: time.Second}, watermill.NopLogger{})
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
		if got.Metadata.Get(awsbroker.MetaSQSQueueURL) != url || got.Metadata.Get(awsbroker.MetaSQSReceiptHandle) == "" {
			t.Errorf("copy %d: SQS metadata %v", i, got.Metadata)
		}
		ids[got.Metadata.Get(awsbroker.MetaSQSMessageID)] = true
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
			queue := "awsbroker-test-retry-" + tc.name
			sub, url, err := a.SQSSubscriber(ctx, queue, awsbroker.QueueOptions{VisibilityTimeout: time.Minute, WaitTime: time.Second}, watermill.NopLogger{})
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
