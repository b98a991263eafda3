package dedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/event"
	"github.com/watermill-dedup/watermill-dedup/dedup/fakeclock"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// TestTransportKeyIsItsOwnEvent: a key equal to the message's transport
// id (ErrTransportKey) is decided transport_key, not key_missing: it is
// the key function's fault, not the message's, and a dashboard tells the
// two apart. The same through the middleware (the Watermill UUID, an SQS
// MessageId in the metadata), Engine.Do, and Engine.Do with Call.KeyErr.
func TestTransportKeyIsItsOwnEvent(t *testing.T) {
	obs := newDecisions()
	d, err := dedup.New(dedup.Config{Store: memstore.New(nil), Scope: "s", Observer: obs,
		Key: func(msg *message.Message) (string, error) {
			if id := msg.Metadata.Get("sqs_message_id"); id != "" {
				return id, nil
			}
			return msg.UUID, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) {
		t.Error("the handler ran")
		return nil, nil
	})
	if _, err := h(message.NewMessage("uuid-1", nil)); !errors.Is(err, dedup.ErrTransportKey) {
		t.Errorf("key = UUID: %v", err)
	}
	sqs := message.NewMessage("uuid-2", nil)
	sqs.Metadata.Set("sqs_message_id", "mid-2")
	if _, err := h(sqs); !errors.Is(err, dedup.ErrTransportKey) {
		t.Errorf("key = sqs_message_id: %v", err)
	}
	e, err := dedup.NewEngine(dedup.Config{Store: memstore.New(nil), Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	work := func(context.Context) ([]byte, error) { t.Error("the work ran"); return nil, nil }
	if _, err := e.Do(context.Background(), dedup.Call{Scope: "s", Key: "uuid-3", MessageUUID: "uuid-3"}, work); !errors.Is(err, dedup.ErrTransportKey) {
		t.Errorf("Do: %v", err)
	}
	terr := errors.Join(dedup.ErrTransportKey, errors.New("the key is the record's sequence number"))
	if _, err := e.Do(context.Background(), dedup.Call{Scope: "s", KeyErr: terr}, work); !errors.Is(err, dedup.ErrTransportKey) {
		t.Errorf("Do with KeyErr: %v", err)
	}
	if n := len(obs.of(event.TransportKey)); n != 4 {
		t.Errorf("%d transport_key decisions, want 4", n)
	}
	for _, dec := range obs.of(event.KeyMissing) {
		t.Errorf("key_missing decided for %v", dec.Err)
	}
	// A missing key stays key_missing.
	if _, err := e.Do(context.Background(), dedup.Call{Scope: "s", KeyErr: &dedup.KeyError{Reason: "missing"}}, work); !errors.Is(err, dedup.ErrNoKey) {
		t.Errorf("Do with KeyErr: %v", err)
	}
	if n := len(obs.of(event.KeyMissing)); n != 1 {
		t.Errorf("%d key_missing decisions, want 1", n)
	}
}

// TestStartByReleasesALateClaim: a claim won at or after the call's
// StartBy is released without running the work (ErrNotStarted), and
// an InProgressWait ends by StartBy.
func TestStartByReleasesALateClaim(t *testing.T) {
	clock := fakeclock.New(epoch)
	store := memstore.New(clock)
	obs := newDecisions()
	e, err := dedup.NewEngine(dedup.Config{Store: store, Clock: clock, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Do(context.Background(), dedup.Call{Scope: "s", Key: "k", StartBy: epoch}, func(context.Context) ([]byte, error) {
		t.Error("the work ran after StartBy")
		return nil, nil
	})
	if !errors.Is(err, dedup.ErrNotStarted) || dedup.IsPermanent(err) {
		t.Errorf("Do: %v, want ErrNotStarted (retryable)", err)
	}
	if n := len(obs.of(event.Released)); n != 1 {
		t.Errorf("%d released decisions, want 1", n)
	}
	// The key is free again.
	res, err := e.Do(context.Background(), dedup.Call{Scope: "s", Key: "k", StartBy: epoch.Add(time.Second)}, func(context.Context) ([]byte, error) { return nil, nil })
	if err != nil || res.Outcome != dedup.Acquired {
		t.Errorf("a retry with time left: %v, %v", res.Outcome, err)
	}
}
