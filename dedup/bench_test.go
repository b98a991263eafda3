package dedup_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/memstore"
)

// BenchmarkMiddlewareOverhead measures the middleware's own cost on the
// memory store, against calling the store directly (Claim + Complete): the
// ratio is what the middleware adds on top of its two store calls.
func BenchmarkMiddlewareOverhead(b *testing.B) {
	key := func(m *message.Message) (string, error) { return m.Metadata.Get("id"), nil }
	msgs := make([]*message.Message, 1<<16)
	for i := range msgs {
		msgs[i] = message.NewMessage(fmt.Sprint("uuid-", i), nil)
		msgs[i].Metadata.Set("id", fmt.Sprint("ORDER-", i))
	}
	noop := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	b.Run("store-only", func(b *testing.B) {
		store := memstore.New(nil)
		ctx := context.Background()
		for i := 0; b.Loop(); i++ {
			res, err := store.Claim(ctx, fmt.Sprint("s:", i), "", 30*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			if err := store.Complete(ctx, res.Claim, nil, 24*time.Hour); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, heartbeat := range []bool{true, false} {
		b.Run(fmt.Sprintf("middleware/heartbeat=%v", heartbeat), func(b *testing.B) {
			d, err := dedup.New(dedup.Config{Store: memstore.New(nil), Key: key, Scope: "s", DisableHeartbeat: !heartbeat})
			if err != nil {
				b.Fatal(err)
			}
			h := d.Middleware(noop)
			round := 0
			for i := 0; b.Loop(); i++ {
				if i%len(msgs) == 0 && i > 0 {
					round++
					for j := range msgs {
						msgs[j].Metadata.Set("id", fmt.Sprint("ORDER-", round, "-", j))
					}
				}
				if _, err := h(msgs[i%len(msgs)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
