package dedup

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

// TakeKey takes what msg is claimed under into call: the one rule of every
// entry point that gets Watermill messages (the Deduplicator, the Lambda
// adapters of lambdadedup), in three steps:
//
//  1. The key is c.Key(msg). An error that matches ErrNoKey or
//     ErrTransportKey is returned as it is; any other error, a panic of
//     the key function, or a nil Key is returned as a *KeyError (it
//     matches ErrNoKey, and the error with errors.Is/As).
//  2. The key must differ from every transport id of this copy of the
//     message: msg.UUID, the transportIDs given (ids the caller knows of,
//     such as a Lambda record's sequence number), and those of
//     c.TransportIDs(msg) (by default the metadata entries sqs_message_id,
//     MessageId, message_id and sns_message_id); empty ids are ignored. An
//     equal key is an error matching ErrTransportKey. Then call.Key is
//     set, and call.MessageID, when empty, becomes the first of those ids
//     but msg.UUID.
//  3. call.Fingerprint is c.Fingerprint(msg), when set; its error or panic
//     is a *KeyError with Field "fingerprint" (call.Key stays set: it
//     names the record in the refusal's decision).
//
// A panic of TransportIDs is a *KeyError with Field "transport ids". Every
// *KeyError names msg.UUID. Every error is permanent (IsPermanent): the
// same message gets it every time; nothing was claimed. Pass it as
// Call.KeyErr for Engine.Do to decide it (key_missing or transport_key,
// would_reject with Config.Shadow). The key's own rules (not blank, UTF-8
// without control characters, at most Config.MaxKeyLength bytes) are
// Engine.Do's. Cost: the configured functions' calls; no store round trip,
// and no allocation of its own unless it fails.
func (c *Config) TakeKey(call *Call, msg *message.Message, transportIDs ...string) (err error) {
	field, what := "", "key function" // the step under way, for a panic
	defer func() {
		if p := recover(); p != nil {
			err = &KeyError{Field: field, Reason: fmt.Sprintf("%s panicked: %v", what, p), MessageUUID: msg.UUID}
		}
	}()
	if c.Key == nil {
		return &KeyError{Reason: "no key function (Config.Key is nil)", MessageUUID: msg.UUID}
	}
	key, err := c.Key(msg)
	if err != nil {
		if errors.Is(err, ErrNoKey) || errors.Is(err, ErrTransportKey) {
			return err
		}
		return &KeyError{Reason: "key function failed", MessageUUID: msg.UUID, Err: err}
	}

	field, what = "transport ids", "TransportIDs"
	messageID := call.MessageID
	found := key != "" && key == msg.UUID
	for _, id := range transportIDs {
		found = found || id != "" && id == key
		if messageID == "" {
			messageID = id
		}
	}
	if c.TransportIDs != nil {
		for _, id := range c.TransportIDs(msg) {
			found = found || id != "" && id == key
			if messageID == "" {
				messageID = id
			}
		}
	} else {
		for _, name := range transportIDMetadata {
			id := msg.Metadata[name]
			found = found || id != "" && id == key
			if messageID == "" {
				messageID = id
			}
		}
	}
	if found {
		return fmt.Errorf("%w: key %q is a transport id of this copy of the message; take the key from the business payload", ErrTransportKey, key)
	}
	call.Key, call.MessageID = key, messageID

	if c.Fingerprint != nil {
		field, what = "fingerprint", "fingerprint function"
		if call.Fingerprint, err = c.Fingerprint(msg); err != nil {
			call.Fingerprint = ""
			return &KeyError{Field: "fingerprint", Reason: "fingerprint failed", MessageUUID: msg.UUID, Err: err}
		}
	}
	return nil
}
