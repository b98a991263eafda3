// Package memory is a [dedup.Store] in process memory, for tests, examples
// and single-process consumers:
//
//	store, err := memory.New(ctx, memory.Config{}) // never fails; Config.Clock for a fake clock
//
// It deduplicates only within one process and forgets everything on
// restart; see [Store].
package memory

import "github.com/watermill-dedup/watermill-dedup/dedup"

var _ dedup.Store = (*Store)(nil)
