// Package admit carries a store's default claim admission to the engine:
// how many Claim requests dedup.Config.MaxClaimsInFlight admits at once
// when the user leaves it at zero. The capability is internal to this
// repository; stores/redis has it (Store.ClaimAdmission, documented there).
//
// It imports nothing of this module, so that package dedup (which reads
// the capability) and the stores (which have it) can both import it.
package admit

// Store is the capability: a store that admits more concurrent claims
// than the engine's default (16) at no cost to Complete, Release and
// Extend says how many. stores/redis has it with Config.AutoPipeline,
// whose batcher sends every command of the store in a bounded number of
// batches, so that a higher bound only makes the batches larger.
type Store interface {
	// ClaimAdmission returns the number of Claim requests the engine
	// admits at once by default; 0 or less: the engine's own default.
	ClaimAdmission() int
}

// Of returns the admission default of store: its ClaimAdmission when it
// has the capability and says a positive number, else 0.
func Of(store any) int {
	if s, ok := store.(Store); ok {
		if n := s.ClaimAdmission(); n > 0 {
			return n
		}
	}
	return 0
}
