// Package storekit holds what the stores of this module share and users do
// not need: owner tokens, duration and list-limit checks, the wall clock.
package storekit

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
)

// NewToken returns a fresh owner token: 16 bytes from crypto/rand, hex
// encoded (32 characters). It panics only if the operating system's random
// source fails, as crypto/rand itself does.
func NewToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error; it crashes the program instead.
	return hex.EncodeToString(b[:])
}

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
