package storekit_test

import (
	"encoding/hex"
	"sync"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

// TestTokensAreDistinct draws tokens from several goroutines, across many
// refills of the buffered random source: no token may come out twice, and
// none may be all zeroes (a handed-out, cleared slice of the buffer).
func TestTokensAreDistinct(t *testing.T) {
	const workers, each = 8, 5000
	var mu sync.Mutex
	seen := make(map[[16]byte]bool, workers*each)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([][16]byte, 0, each)
			for range each {
				local = append(local, storekit.RawToken())
			}
			mu.Lock()
			defer mu.Unlock()
			for _, tok := range local {
				if seen[tok] || tok == ([16]byte{}) {
					t.Errorf("token %x handed out twice or zero", tok)
				}
				seen[tok] = true
			}
		}()
	}
	wg.Wait()
	tok := storekit.NewToken()
	if b, err := hex.DecodeString(tok); err != nil || len(b) != 16 {
		t.Fatalf("NewToken %q: want 32 hex digits", tok)
	}
}
