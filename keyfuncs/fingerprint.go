package keyfuncs

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/ThreeDotsLabs/watermill/message"
)

// PayloadFingerprint is a fingerprint function for dedup.Config.Fingerprint: the hex SHA-256 of the
// payload. Metadata is not included (brokers add their own attributes to
// each copy). With it, a key already recorded for a different payload gives
// dedup.ErrKeyReuse instead of a duplicate.
func PayloadFingerprint(msg *message.Message) (string, error) {
	sum := sha256.Sum256(msg.Payload)
	return hex.EncodeToString(sum[:]), nil
}
