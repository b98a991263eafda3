package dedup

import (
	"encoding/binary"
	"hash/maphash"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-dedup/watermill-dedup/dedup/event"
)

// A message refused for good (key_missing, transport_key, key_reuse) is
// refused the same way every time it comes back, and a router without a
// poison queue sends it back at once, thousands of times a second. Such
// refusals are logged once and then counted (see repeatLog); the Observer
// and the call's trace are still told of each.
const (
	// repeatsEvery is how often the refusals of one message that keeps
	// coming back are logged: one line per message and event at most
	// every 30s after its first, with the count since the last. The hints
	// below say it.
	repeatsEvery = 30 * time.Second
	// repeatMessages bounds the messages remembered (see repeatLog).
	repeatMessages = 1024
)

// The hint of a refused message's first line: what stops its refusals from
// coming back. The Deduplicator's (a router) names the poison queue.
const (
	routerRefusedHint = "a message refused for good (dedup.IsPermanent) comes back at once, endlessly, unless a poison queue takes it: " +
		"add middleware.PoisonQueueWithFilter(publisher, topic, dedup.IsPermanent) to the router (see docs/router.md); " +
		"until then this message's further refusals are counted and logged every 30s"
	refusedHint = "a message refused for good (dedup.IsPermanent) is refused again on every redelivery: route it to a dead-letter or poison queue; " +
		"this message's further refusals are counted and logged every 30s"
)

// refusal reports whether ev refuses a message for good.
func refusal(ev event.Event) bool {
	return ev == event.KeyMissing || ev == event.TransportKey || ev == event.KeyReuse
}

// logDecision writes dec's line to the Logger; a refusal of a message
// seen before only when repeatLog says so.
func (e *Engine) logDecision(call *Call, dec Decision) {
	var extra watermill.LogFields
	if refusal(dec.Event) && (call.MessageUUID != "" || call.MessageID != "") {
		var log bool
		if log, extra = e.repeats.note(call, dec.Event, e.cfg.Clock.Now(), e.hint); !log {
			return
		}
	}
	dec.log(e.cfg.Logger, extra)
}

// repeatLog remembers the refusals of messages, so that a message refused
// again and again is logged once and then counted. A message is its
// call's Scope, Handler, MessageUUID and MessageID, with the event (a
// call with neither MessageUUID nor MessageID is not remembered: each of
// its refusals is logged):
//
//   - its first refusal is logged, with the field hint (what to add);
//   - a later one is counted, unless repeatsEvery (30s, on Config.Clock)
//     has passed since the message's last line: then it is logged, with
//     the fields repeats (the refusals since that line, this one
//     included) and repeats_since (the time since that line). Refusals
//     that stop within the 30s are in no line but the Observer's counts.
//
// At most repeatMessages (1024) messages are remembered, as 64-bit hashes
// (maphash) in a map and a ring of its keys: about 70 KB, taken at the
// first refusal, and no more. Past the bound a new message takes the place of
// the one remembered first, which is logged again, with its hint, if it
// comes back: a new message's first line is never dropped (unless its
// hash equals that of a message remembered, one chance in about 10^16).
type repeatLog struct {
	mu   sync.Mutex
	seed maphash.Seed
	// epoch is the time of the first refusal: the times of the lines are
	// kept as durations since (no pointer in the map for the collector to
	// scan).
	epoch time.Time
	seen  map[uint64]repeated // nil until the first refusal
	// order holds the keys of seen in the order they were added: a ring
	// once full, next its oldest.
	order []uint64
	next  int
}

// repeated is a message refused before.
type repeated struct {
	logged time.Duration // its last line, since epoch
	count  int           // its refusals since, not logged
}

// note notes a refusal ev of call's message at now, and says whether to
// log it and with which fields.
func (r *repeatLog) note(call *Call, ev event.Event, now time.Time, hint string) (bool, watermill.LogFields) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seed, r.epoch = maphash.MakeSeed(), now
		r.seen = make(map[uint64]repeated, repeatMessages)
		r.order = make([]uint64, 0, repeatMessages)
	}
	id, at := r.id(call, ev), now.Sub(r.epoch)
	if m, ok := r.seen[id]; ok {
		m.count++
		since := at - m.logged
		if since < repeatsEvery {
			r.seen[id] = m
			return false, nil
		}
		r.seen[id] = repeated{logged: at}
		return true, watermill.LogFields{"repeats": m.count, "repeats_since": since}
	}
	if len(r.order) < repeatMessages {
		r.order = append(r.order, id)
	} else {
		delete(r.seen, r.order[r.next])
		r.order[r.next] = id
		r.next = (r.next + 1) % repeatMessages
	}
	r.seen[id] = repeated{logged: at}
	return true, watermill.LogFields{"hint": hint}
}

// id is the hash of a message and event.
func (r *repeatLog) id(call *Call, ev event.Event) uint64 {
	var h maphash.Hash
	h.SetSeed(r.seed)
	var n [8]byte
	for _, s := range [...]string{call.Scope, call.Handler, call.MessageUUID, call.MessageID, string(ev)} {
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.WriteString(s)
	}
	return h.Sum64()
}

// remembered is how many messages the log remembers (for tests).
func (r *repeatLog) remembered() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}
