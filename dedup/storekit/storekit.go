// Package storekit is what a dedup.Store is built with: the pieces every
// store of this repository shares, exported so that a store outside it can
// do all they do. The contract itself (dedup.Store, the optional
// capabilities, the held claim) is in package dedup; this package holds
// helpers on top of it:
//
//   - owner tokens (NewToken, RawToken) and the checks every store makes
//     (CheckDuration, CheckListLimit, IsNil), the wall clock (WallClock);
//   - concurrent requests for a store's batch methods (Each,
//     EachInKeyOrder);
//   - the key watches of a dedup.KeyWatcher (WatchHub);
//   - the completion of a claim inside the work's own transaction
//     (RunInTx, with the store's Tx, and TxMiddleware for Watermill).
//
// Nothing here is needed to use a store: applications import package
// dedup and a store.
package storekit

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
)

// NewToken returns a fresh owner token: 16 bytes from crypto/rand (see
// RawToken), hex encoded (32 characters).
func NewToken() string {
	t := RawToken()
	var b [32]byte
	return string(hex.AppendEncode(b[:0], t[:]))
}

// RawToken returns 16 fresh bytes from crypto/rand. The bytes are read a
// kilobyte at a time into per-processor buffers (a sync.Pool), and each is
// handed out once: one read of the operating system's random source per 64
// tokens instead of one per token (a getrandom system call where the vDSO
// lacks it). It panics only if that source fails, as crypto/rand itself
// does.
func RawToken() (t [16]byte) {
	b := randomBytes.Get().(*randomBuffer)
	if b.next == len(b.buf) {
		_, _ = rand.Read(b.buf[:]) // crypto/rand.Read never returns an error; it crashes the program instead.
		b.next = 0
	}
	copy(t[:], b.buf[b.next:])
	clear(b.buf[b.next : b.next+len(t)]) // never handed out twice, even by a buffer copied by mistake
	b.next += len(t)
	randomBytes.Put(b)
	return t
}

type randomBuffer struct {
	buf  [1024]byte
	next int // the first byte not handed out; len(buf): none left
}

var randomBytes = sync.Pool{New: func() any { return &randomBuffer{next: 1024} }}

// CheckDuration returns an error wrapping dedup.ErrInvalidDuration when d is
// not positive. Stores call it on every lease and retention they receive.
func CheckDuration(name string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: %s must be positive, got %v", dedup.ErrInvalidDuration, name, d)
	}
	return nil
}

// CheckListLimit returns an error unless 1 <= limit <= admin.MaxListLimit.
// Stores call it in List.
func CheckListLimit(limit int) error {
	if limit < 1 || limit > admin.MaxListLimit {
		return fmt.Errorf("dedup: list limit must be between 1 and %d, got %d", admin.MaxListLimit, limit)
	}
	return nil
}

// WallClock is the wall clock as a dedup.Clock, for stores whose Config
// takes a Clock that defaults to it.
type WallClock struct{}

// Now returns time.Now().
func (WallClock) Now() time.Time { return time.Now() }

// AfterFunc is time.AfterFunc.
func (WallClock) AfterFunc(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }

// IsNil reports whether a client given in a store's Config is missing:
// nil, or an interface holding a nil pointer (a nil *redis.Client, a nil
// *pgxpool.Pool), which is not == nil yet fails on first use. New refuses
// both with the store's typed error instead of panicking later.
func IsNil(client any) bool {
	if client == nil {
		return true
	}
	switch v := reflect.ValueOf(client); v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}
