package dynamo_test

import (
	"math"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

// TestMaxRetentionKeepsTheRecord: the longest time.Duration is a valid
// retention (dedup.Config accepts it, the store refuses only <= 0), so the
// completed record must suppress a duplicate. Rounding it up to whole
// milliseconds must not overflow into a deadline in the past.
func TestMaxRetentionKeepsTheRecord(t *testing.T) {
	s := newStore(t, dynamo.Config{})
	key := testKey(t, "k")
	res := mustClaim(t, s, key, "", time.Minute, dedup.Acquired)
	mustComplete(t, s, res.Claim, nil, time.Duration(math.MaxInt64))
	mustClaim(t, s, key, "", time.Minute, dedup.Duplicate)
}

// TestMaxLeaseHoldsTheKey: the same for a lease.
func TestMaxLeaseHoldsTheKey(t *testing.T) {
	s := newStore(t, dynamo.Config{})
	key := testKey(t, "k")
	mustClaim(t, s, key, "", time.Duration(math.MaxInt64), dedup.Acquired)
	mustClaim(t, s, key, "", time.Minute, dedup.InProgress)
}
