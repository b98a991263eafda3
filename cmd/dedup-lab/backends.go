package main

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/lab"
)

// broker creates one transport per lab run.
type broker struct {
	transport func(ctx context.Context, run string) (*lab.Transport, error)
	close     func()
}

// store gives the lab its dedup store.
type store struct {
	store func(ctx context.Context) (dedup.Store, error)
	close func()
}

var brokers = map[string]func(ctx context.Context) (*broker, error){
	"gochannel": newGoChannelBroker,
}

var stores = map[string]func(ctx context.Context) (*store, error){
	"memory": newMemoryStore,
}

func newGoChannelBroker(context.Context) (*broker, error) {
	return &broker{
		transport: func(_ context.Context, run string) (*lab.Transport, error) {
			ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1 << 16}, watermill.NopLogger{})
			return &lab.Transport{Publisher: ps, Subscriber: ps, Topic: "orders-" + run, Close: ps.Close}, nil
		},
		close: func() {},
	}, nil
}

func newMemoryStore(context.Context) (*store, error) {
	s := dedup.NewMemoryStore(nil)
	return &store{store: func(context.Context) (dedup.Store, error) { return s, nil }, close: func() {}}, nil
}
