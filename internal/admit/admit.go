// Package admit carries a store's default claim admission to the engine:
// how many Claim requests dedup.Config.MaxClaimsInFlight admits at once
// when the user leaves it at zero. It is internal, so that no store's
// exported API grows a method for it: a store embeds a Default under an
// unexported name (an alias), which gives it the method without a line in
// its api.txt or its package documentation.
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

// Default is a store's admission default, to embed (under an unexported
// alias) in the store's type.
type Default struct{ n int }

// NewDefault returns a Default of n claims (0: none, the engine's own).
func NewDefault(n int) Default { return Default{n: n} }

// ClaimAdmission returns n.
func (d Default) ClaimAdmission() int { return d.n }

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
