// Package event names the decisions of the dedup engine: every
// dedup.Decision carries one [Event], every log line of the middleware
// carries it in the field "dedup_event", and the metrics and tracing
// adapters label by it. The names are stable.
//
// Each constant's doc says what the decision means and the log level the
// middleware writes it at. Without a dedup.Config.Logger only the error
// level is written (to log/slog's default logger), and a refusal
// (KeyMissing, TransportKey, KeyReuse) of a message that keeps coming
// back is logged once and then counted, whatever the Logger (see
// dedup.Config.Logger). Package lambdadedup adds events of its own, of
// the same type, for records it decides without the engine
// (deadline_skipped, group_skipped, permanent_dropped, handler_panic).
package event

// Event names one decision of the middleware. The names are stable: logs
// carry them in the field "dedup_event" and metrics label by them.
type Event string

const (
	// ClaimWon: the key was acquired; the handler runs. Debug level.
	ClaimWon Event = "claim_won"
	// Completed: the handler succeeded and the record is completed.
	// Debug level.
	Completed Event = "completed"
	// SkipDuplicate: the key was already completed; acked without
	// calling the handler. Info level.
	SkipDuplicate Event = "skip_duplicate"
	// InProgress: another consumer holds the key; nacked with
	// dedup.ErrInProgress. Info level.
	InProgress Event = "in_progress"
	// Released: the handler failed or panicked; the claim was released
	// so a redelivery runs it again. Info level.
	Released Event = "released"
	// ClaimLost: the record no longer carried this claim's token when
	// extending, completing or releasing it, or the lease ended (no
	// extension succeeded) before the work finished: another consumer may
	// have run the effect too. Error level. A work cancelled at the lease
	// deadline that still completes its record within the lease is
	// completed, not claim_lost: one call, one outcome.
	ClaimLost Event = "claim_lost"
	// KeyMissing: no usable key (dedup.ErrNoKey). Error level: the message
	// goes to the poison queue, if any.
	KeyMissing Event = "key_missing"
	// TransportKey: the key is a transport id of the message
	// (dedup.ErrTransportKey): the key function reads the broker's message id
	// instead of a business id, a fault of the consumer's code rather than
	// of the message. Error level: the message goes to the poison queue, if
	// any.
	TransportKey Event = "transport_key"
	// KeyReuse: the key was recorded with another fingerprint
	// (dedup.ErrKeyReuse). Error level.
	KeyReuse Event = "key_reuse"
	// StoreError: a store operation failed. Error level.
	StoreError Event = "store_error"
	// FailOpen: dedup.Config.FailOpen ran the handler without a claim because
	// the store failed. Error level.
	FailOpen Event = "fail_open"
	// WouldSkip: dedup.Config.Shadow ran the handler without a claim although
	// the key was completed (dedup.Decision.Outcome Duplicate: it would have been
	// acked without running) or held by another claim (InProgress: it would
	// have been nacked, then skipped once the holder completed). The record
	// is left as it was. Info level.
	WouldSkip Event = "would_skip"
	// WouldReject: dedup.Config.Shadow ran the handler without a claim although
	// dedup would have refused the message with a permanent error: the key
	// was recorded with another fingerprint (Outcome Conflict, dedup.ErrKeyReuse)
	// or the message has no usable key (dedup.ErrNoKey, dedup.ErrTransportKey; no
	// Outcome). dedup.Decision.Err says which. Info level.
	WouldReject Event = "would_reject"
)
