package producerkey

import (
	"crypto/rand"
	"encoding/hex"
)

// newKey returns 16 random bytes from crypto/rand, hex encoded (32
// characters). crypto/rand.Read does not fail; it crashes the program when
// the operating system's source does.
func newKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
