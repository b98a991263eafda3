package dedup

import (
	"context"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Origin says which copy of a message (or which request) a claim was made
// for: the transport's ids of that copy, never the business key. A store
// keeps the Origin of the first claim of a key with its record, beside
// the time of that claim, the time of completion and the number of claims
// it took (see dedup/admin.Record), so that an operator can tell which of
// ten copies of ORDER-003 ran the effect.
//
// The entry points fill it: the Watermill middleware with the message's
// UUID and the SQS MessageId (metadata sqs_message_id, MessageId,
// message_id or sns_message_id, or the first of Config.TransportIDs),
// the Lambda adapter with the record's message id, httpdedup with the
// request's X-Request-Id header (see its Config.RequestID), Engine.Do
// with Call.MessageUUID and Call.MessageID. A store reads it with
// OriginFromContext on the context its Claim was given.
type Origin struct {
	// TransportID is the id the transport gave this copy: the Watermill
	// message UUID, the Lambda record's message id, an HTTP request id.
	TransportID string
	// MessageID is the broker's own id of this copy when there is one
	// besides TransportID (the SQS MessageId for a message that
	// watermill-aws gives a UUID of its own); it may equal TransportID.
	MessageID string
}

// MaxOriginIDLength is the longest id, in bytes, that OriginFromContext
// returns: a store may size its record by it.
const MaxOriginIDLength = 100

// originKey is the context key of the Origin. Its value is an *Origin (set
// by WithOrigin) or, on the claim contexts of the Engine, the Engine's own
// Call.
type originKey struct{}

// WithOrigin returns ctx carrying o, which OriginFromContext returns: for
// code that calls a Store's Claim itself (a store's batch method that
// claims record by record, a test) and for an entry point whose Engine.Do
// Call names neither MessageUUID nor MessageID (httpdedup puts the
// request's id there). Cost: one context.WithValue.
func WithOrigin(ctx context.Context, o Origin) context.Context {
	return context.WithValue(ctx, originKey{}, &o)
}

// OriginFromContext returns the Origin of the claim whose context ctx is
// (a Store calls it in Claim; the contexts the Engine passes to the
// Complete and Release of that claim answer it too), and whether there is
// one. The ids are
// cleaned so that every store can keep them as text: at most 100 bytes
// each (MaxOriginIDLength: a longer id is cut at a character boundary), invalid UTF-8 and control characters replaced by
// U+FFFD. The claim contexts the Engine passes answer it without an
// allocation (an id that needs cleaning costs one).
func OriginFromContext(ctx context.Context) (Origin, bool) {
	var o Origin
	switch v := ctx.Value(originKey{}).(type) {
	case *Call: // the claim's context (workContext.Value)
		o = Origin{TransportID: v.MessageUUID, MessageID: v.MessageID}
	case *Origin:
		o = *v
	}
	if o.TransportID == "" && o.MessageID == "" {
		return Origin{}, false
	}
	return Origin{TransportID: cleanID(o.TransportID), MessageID: cleanID(o.MessageID)}, true
}

// cleanID returns id as OriginFromContext promises it.
func cleanID(id string) string {
	clean := len(id) <= MaxOriginIDLength
	for i := 0; clean && i < len(id); i++ {
		c := id[i]
		clean = c >= 0x20 && c < 0x7f // the usual case: printable ASCII
	}
	if clean {
		return id
	}
	var b strings.Builder
	for _, r := range id { // invalid UTF-8 comes as RuneError
		if unicode.IsControl(r) {
			r = utf8.RuneError
		}
		if b.Len()+utf8.RuneLen(r) > MaxOriginIDLength {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}
