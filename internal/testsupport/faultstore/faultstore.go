// Package faultstore wraps a dedup.Store and injects errors per
// operation, for tests: it stands in for a store whose server misbehaves
// while the records live in the wrapped store.
package faultstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// Store wraps a store and injects errors per operation. It stands in
// for a store whose server misbehaves; the records themselves live in a real
// memory.Store.
type Store struct {
	dedup.Store
	mu    sync.Mutex
	fault map[string][]error // op → errors to return, one per call, before passing through
	calls map[string]int
}

// New wraps s.
func New(s dedup.Store) *Store {
	return &Store{Store: s, fault: map[string][]error{}, calls: map[string]int{}}
}

// Inject queues errs for op ("claim", "complete", "release", "extend"),
// one per call, before calls pass through again.
func (f *Store) Inject(op string, errs ...error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fault[op] = append(f.fault[op], errs...)
}

func (f *Store) next(op string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[op]++
	if len(f.fault[op]) == 0 {
		return nil
	}
	err := f.fault[op][0]
	f.fault[op] = f.fault[op][1:]
	return err
}

// Count returns how many times op was called.
func (f *Store) Count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

func (f *Store) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.ClaimResult, error) {
	if err := f.next("claim"); err != nil {
		return dedup.ClaimResult{}, err
	}
	return f.Store.Claim(ctx, key, fp, lease)
}

// ErrReplyLost makes the Store perform the operation and then report a
// network error, as when the reply is lost on the way back.
var ErrReplyLost = errors.New("reply lost")

func (f *Store) Complete(ctx context.Context, c dedup.Claim, r []byte, ret time.Duration) error {
	if err := f.next("complete"); err != nil {
		if err == ErrReplyLost {
			_ = f.Store.Complete(ctx, c, r, ret)
			return ErrNetwork
		}
		return err
	}
	return f.Store.Complete(ctx, c, r, ret)
}

func (f *Store) Release(ctx context.Context, c dedup.Claim) error {
	if err := f.next("release"); err != nil {
		return err
	}
	return f.Store.Release(ctx, c)
}

func (f *Store) Extend(ctx context.Context, c dedup.Claim, l time.Duration) error {
	if err := f.next("extend"); err != nil {
		return err
	}
	return f.Store.Extend(ctx, c, l)
}

// ErrNetwork stands for a network error.
var ErrNetwork = errors.New("connection refused")
