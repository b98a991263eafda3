// Package recordinfo carries what an entry point knows about a record
// beyond the dedup.Store interface, for stores that keep it in readable
// columns: the HTTP status of the response httpdedup stores, which
// stores/postgres writes into response_status.
//
// The entry point puts an *Info into the context it passes to
// dedup.Engine.Do and fills it before its work returns; the engine passes a
// context derived from that one to Store.Complete, where the store reads
// it. Reading and writing happen in the work's goroutine, one after the
// other.
package recordinfo

import "context"

// Info is what the entry point reports about the record it is completing.
type Info struct {
	// ResponseStatus is the HTTP status of the stored response; 0 when the
	// record is not an HTTP response.
	ResponseStatus int
}

type key struct{}

// With returns ctx carrying info.
func With(ctx context.Context, info *Info) context.Context {
	return context.WithValue(ctx, key{}, info)
}

// From returns the Info in ctx, if any.
func From(ctx context.Context) (*Info, bool) {
	info, ok := ctx.Value(key{}).(*Info)
	return info, ok && info != nil
}
