package lambdadedup_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
)

// TestSQSHandlerReadsTheFence: a Lambda handler reads its record's fence
// from the message's context, and the redelivery of a record that failed
// reads a larger one.
func TestSQSHandlerReadsTheFence(t *testing.T) {
	var (
		mu     sync.Mutex
		fences []uint64
	)
	h := newHandler(t, lambdadedup.Config{}, func(msg *message.Message) error {
		f, ok := dedup.FenceFromContext(msg.Context())
		if !ok {
			t.Error("the handler reads no fence")
		}
		mu.Lock()
		defer mu.Unlock()
		fences = append(fences, f)
		if len(fences) == 1 {
			return errors.New("declined") // released: the redelivery claims again
		}
		return nil
	})
	if f := invoke(t, context.Background(), h, record("m1", order("A"))); !slices.Equal(f, []string{"m1"}) {
		t.Fatalf("failures %v, want [m1]", f)
	}
	if f := invoke(t, context.Background(), h, record("m1", order("A"))); len(f) != 0 {
		t.Fatalf("redelivery: failures %v, want none", f)
	}
	if len(fences) != 2 || fences[0] == 0 || fences[1] <= fences[0] {
		t.Fatalf("fences %v: want two, the second larger", fences)
	}
}
