package storekit

import "time"

// NextFence is the fence of a claim that wins a key at now whose last
// winning claim had fence prev (0: none known, a fresh key or a record the
// store no longer holds): now in microseconds since the Unix epoch, or
// prev+1 when that is not larger. It is the scheme every store of this
// repository uses (dedup.Claim.Fence): while the store holds the key's
// record (released, expired, or completed and past its retention but not
// yet deleted), each winner's fence is larger than the last by
// construction; once the record is gone, the next fence is the clock's,
// larger than every earlier one as long as the clock that stamps it has
// not fallen behind the clock that stamped the last one by more than the
// time since. A store stamps with the clock it decides expiry by (its
// server's where it has one). Microseconds stay below 2^53 until the year
// 2255, so that a fence survives a trip through a float64 (a Lua number, a
// JSON number).
func NextFence(prev uint64, now time.Time) uint64 {
	f := uint64(now.UnixMicro())
	if f <= prev {
		f = prev + 1
	}
	return f
}
