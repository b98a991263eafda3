// Package memstore builds in-memory stores for tests and tools in one
// expression. Library code calls memory.New and handles its error.
package memstore

import (
	"context"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

// New returns a memory store on clock (nil: the wall clock). It panics if
// memory.New refuses the configuration, which it never does today: for
// tests and tools only.
func New(clock dedup.Clock) *memory.Store {
	s, err := memory.New(context.Background(), memory.Config{Clock: clock})
	if err != nil {
		panic(err)
	}
	return s
}
