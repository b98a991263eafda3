package linear

import (
	"context"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

func newMemory(t testing.TB) *memory.Store {
	t.Helper()
	s, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestLinearMemory is the control: the memory store, no faults, every
// operation (single, batch, Inspect) from six clients over three hot keys.
// The memory store fences, so the fences are checked too.
func TestLinearMemory(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	w := defaultWorkload("linear:memory:")
	n := w.run(rec, newTarget(newMemory(t)), nil, 1)
	v := requireLinearizable(t, rec.history(), params{})
	if !v.Fencing {
		t.Errorf("the memory store fences, but no claim carried a fence")
	}
	if v.Takeovers == 0 || v.Afresh == 0 {
		t.Errorf("%d takeovers of an ended lease and %d claims after retention: the workload must exercise both", v.Takeovers, v.Afresh)
	}
	t.Logf("%d calls", n)
}
