package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// Issue 14, item 3: a key with a NUL byte passed the middleware and
// PostgreSQL refused it (SQLSTATE 22021) as a retryable *StoreError, so the
// message was redelivered forever. The core refuses it with ErrNoKey,
// permanent, before the store is touched.
func TestNULKeyIsRefusedBeforePostgres(t *testing.T) {
	store := newStore(t, postgres.Config{})
	d, err := dedup.New(dedup.Config{Store: store, Key: keyfuncs.JSON("order_id"), Scope: "charge-orders"})
	if err != nil {
		t.Fatal(err)
	}
	called := false
	msg := message.NewMessage("u1", []byte(`{"order_id":"ORDER\u0000-1"}`))
	msg.SetContext(context.Background())
	_, err = d.Middleware(func(*message.Message) ([]*message.Message, error) { called = true; return nil, nil })(msg)
	var storeErr *dedup.StoreError
	if !errors.Is(err, dedup.ErrNoKey) || !dedup.IsPermanent(err) || errors.As(err, &storeErr) || called {
		t.Fatalf("got %v (handler called %v), want a permanent ErrNoKey and no store call", err, called)
	}
}
