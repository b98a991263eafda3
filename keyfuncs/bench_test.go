package keyfuncs_test

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
)

// A typical order event, and the same with a 1 KB line-items array before
// the key, so that the cost of skipping members shows.
var (
	benchOrder = `{"event":"order.paid","order_id":"ORDER-003","order":{"id":"ORDER-003","amount":150,"currency":"eur"},"tenant":"acme"}`
	benchLarge = `{"event":"order.paid","items":[` + strings.Repeat(`{"sku":"SKU-1","qty":2,"price":1999},`, 27) +
		`{"sku":"SKU-2","qty":1,"price":5}],"order_id":"ORDER-003","tenant":"acme"}`
)

func benchKey(b *testing.B, kf keyfuncs.Func, payload string) {
	m := message.NewMessage("3f2a1c7e-uuid", []byte(payload))
	if _, err := kf(m); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := kf(m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkJSON(b *testing.B) {
	b.Run("flat", func(b *testing.B) { benchKey(b, keyfuncs.JSON("order_id"), benchOrder) })
	b.Run("nested", func(b *testing.B) { benchKey(b, keyfuncs.JSON("order.id"), benchOrder) })
	b.Run("large", func(b *testing.B) { benchKey(b, keyfuncs.JSON("order_id"), benchLarge) })
}

func BenchmarkSNSEnvelope(b *testing.B) {
	kf := keyfuncs.SNSEnvelope(keyfuncs.JSON("order_id"))
	b.Run("envelope", func(b *testing.B) { benchKey(b, kf, snsEnvelope(benchOrder)) })
	b.Run("raw", func(b *testing.B) { benchKey(b, kf, benchOrder) })
}
