package memory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

var (
	// ErrNoClaim is dedup.ErrNoClaim: TxMiddleware got a message without
	// a dedup claim in its context (it was added before, outside, the
	// dedup middleware), or RunInTx was called outside the work of
	// dedup.Engine.Do. Nothing was written.
	ErrNoClaim = dedup.ErrNoClaim

	// ErrNestedTx is dedup.ErrNestedTx: RunInTx (or TxMiddleware) was
	// called for a claim whose RunInTx still runs, or after one completed
	// the record. Its work did not run. Write through the Tx already open
	// instead: call RunInTx only when TxFromContext finds none.
	ErrNestedTx = dedup.ErrNestedTx

	// ErrTxDone is the error of Tx.Set and Tx.Delete once the Tx has
	// ended: its RunInTx has written or dropped the writes, and a later
	// one would be lost. Write only while the work runs.
	ErrTxDone = errors.New("memory: the transaction has ended")
)

// Tx holds the writes of one RunInTx to the store's key-value space (see
// Get) until the work returns: they are then written in the same step as
// the completion of the work's claim, under the store's mutex, only if the
// store still holds the claim; or not at all. Get it with TxFromContext.
// Safe for concurrent use.
//
// The key-value space stands for the database an effect is written to:
// it lets tests and single-process programs complete a record together
// with its effect, as stores/postgres, stores/dynamo and stores/redis do.
// Its values do not expire.
type Tx struct {
	mu sync.Mutex
	// writes holds the last write of each key; nil: a deletion.
	writes map[string][]byte
	done   bool
}

type txKey struct{}

// TxFromContext returns the transaction RunInTx (or TxMiddleware) runs the
// work in.
func TxFromContext(ctx context.Context) (*Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*Tx)
	return tx, ok
}

// Set writes a copy of value under key, for when the transaction
// completes; the last write of a key wins. Other transactions and Get do
// not see it until then. After the transaction ended: ErrTxDone, nothing
// written.
func (t *Tx) Set(key string, value []byte) error {
	return t.put(key, append([]byte{}, value...)) // never nil: nil deletes
}

// Delete deletes key's value when the transaction completes. After the
// transaction ended: ErrTxDone.
func (t *Tx) Delete(key string) error { return t.put(key, nil) }

func (t *Tx) put(key string, value []byte) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return ErrTxDone
	}
	if t.writes == nil {
		t.writes = map[string][]byte{}
	}
	t.writes[key] = value
	return nil
}

// end ends the transaction and returns its writes.
func (t *Tx) end() map[string][]byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done = true
	w := t.writes
	t.writes = nil
	return w
}

// Get returns a copy of the value a transaction wrote under key, and
// whether there is one: what RunInTx committed, never a write still in a
// Tx. Cost: one map lookup and a copy under the store's mutex.
func (s *Store) Get(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.values[key]
	if !ok {
		return nil, false
	}
	return append([]byte{}, v...), true
}

// TxMiddleware is a Watermill middleware that writes what the handler
// writes through TxFromContext(msg.Context()) together with the completion
// of its dedup record, only while the claim is still the handler's. Add it
// after (inside) the dedup middleware, with this Store as the dedup
// middleware's store:
//
//	router.AddMiddleware(deduplicator.Middleware, store.TxMiddleware)
//
// See RunInTx for what happens then. It is storekit.TxMiddleware on
// RunInTx.
func (s *Store) TxMiddleware(h message.HandlerFunc) message.HandlerFunc {
	return storekit.TxMiddleware(h, s.RunInTx)
}

// RunInTx runs work with a Tx (TxFromContext), then writes the Tx's writes
// and the completion of the record of the claim work runs under in one
// step, under the store's mutex: no other call sees the writes without the
// completion. Call it inside the work given to dedup.Engine.Do (its
// context carries the claim); TxMiddleware calls it for a Watermill
// handler, httpdedup through Config.InTransaction. It is storekit.RunInTx
// with the memory store's atomic step, and behaves as the network
// stores' RunInTx:
//
//   - work returns nil: if the store still holds the claim in progress
//     under its token, the writes are written and the record completed as
//     Complete would (the result is work's bytes, the response status that
//     of the dedup.RecordDetails in ctx), and the claim is marked
//     completed so that the engine does not complete it again. RunInTx
//     returns work's bytes.
//   - the claim was lost (its lease ended, another claim took the record
//     over, it was evicted): nothing is written, and the error wraps
//     dedup.ErrClaimLost.
//   - work returns an error or panics: nothing is written; the error (or
//     panic) goes on, and the engine releases the claim.
//   - called inside a RunInTx of the same claim, or after one completed
//     the record: ErrNestedTx before work runs.
//   - a context without a claim: ErrNoClaim before work runs, except a
//     run the engine marks as unclaimed (dedup.Config.Shadow, or FailOpen
//     while the store cannot be reached; see dedup.RunsUnclaimed): the
//     writes are then written alone and nothing is completed.
//
// Nothing is sent anywhere, so there is no reply to lose: the step either
// happened when RunInTx returns or did not. Cost: one map write per key
// written, and the completion, under one acquisition of the store's mutex.
func (s *Store) RunInTx(ctx context.Context, work func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	return storekit.RunInTx(ctx, txFinishTimeout, s.beginTx, work)
}

// txFinishTimeout is RunInTx's bound on the completion once work has
// returned; nothing of the memory store waits, so it is never reached.
const txFinishTimeout = time.Minute

// beginTx opens the Tx of a RunInTx (storekit.RunInTx); the claim is the
// txRun's to complete.
func (s *Store) beginTx(ctx context.Context, _ *dedup.Claim) (context.Context, storekit.Tx, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	tx := &Tx{}
	return context.WithValue(ctx, txKey{}, tx), txRun{s: s, tx: tx}, nil
}

// txRun ends a Tx for storekit.RunInTx: the writes and the completion
// under one acquisition of the store's mutex, the writes alone, or
// nothing.
type txRun struct {
	s  *Store
	tx *Tx
}

func (r txRun) Complete(ctx context.Context, claim dedup.Claim, result []byte, retention time.Duration) (bool, error) {
	writes := r.tx.end()
	status := responseStatus(ctx)
	now := r.s.clock.Now()
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if err := r.s.completeLocked(claim, result, retention, status, now); err != nil {
		return false, fmt.Errorf("memory: complete in transaction %.200q: the work's writes were not written: %w", claim.Key, err)
	}
	r.s.write(writes)
	return true, nil
}

func (r txRun) Commit(context.Context) error {
	writes := r.tx.end()
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	r.s.write(writes)
	return nil
}

func (r txRun) Abort(context.Context) { r.tx.end() }

// write writes a Tx's writes into the key-value space. s.mu held.
func (s *Store) write(writes map[string][]byte) {
	for k, v := range writes {
		if v == nil {
			delete(s.values, k)
			continue
		}
		if s.values == nil {
			s.values = map[string][]byte{}
		}
		s.values[k] = v
	}
}
