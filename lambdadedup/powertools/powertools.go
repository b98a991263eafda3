// Package powertools computes idempotency keys as Powertools for AWS
// Lambda computes them, so that a Go function on dedup shares records
// with Powertools functions: the same JMESPath selection of the same
// event gives the same key, in the same DynamoDB table
// (stores/dynamo with FormatPowertools).
//
// Powertools' key is "<prefix>#<hash>": the hash of the canonical JSON of
// what Config.EventKeyJMESPath selects in the event. Keys.Key returns the
// hash as the business key; with the prefix as the dedup scope, the
// DynamoDB store in FormatPowertools writes the record under
// "<prefix>#<hash>", the item a Powertools function reads:
//
//	keys, err := powertools.New(powertools.Config{
//		Runtime:          powertools.TypeScript,
//		Prefix:           "charge-orders", // the Powertools function's name (or its keyPrefix)
//		EventKeyJMESPath: "powertools_json(body).order_id",
//	})
//	…
//	lambdadedup.New(lambdadedup.Config{Dedup: dedup.Config{
//		Store: store, Key: keys.Key, Scope: "charge-orders", …
//	}}, handler)
//
// Each runtime serializes and hashes the selection its own way, and both
// are reproduced here (checked against the real packages: see the
// package's tests and docs/migrating-from-powertools.md for the cases that
// cannot agree):
//
//   - TypeScript (@aws-lambda-powertools/idempotency 2.x): the base64 of
//     the MD5 of JSON.stringify of the selection, object keys sorted
//     without regard to case (its deepSort), numbers as JavaScript writes
//     doubles;
//   - Python (aws-lambda-powertools 3.x): the hex of the MD5 of
//     json.dumps(selection, sort_keys=True): ", " and ": " separators,
//     every character outside printable ASCII escaped, integers exact and
//     floats as Python's repr writes them.
//
// The selection runs on what the function's Powertools utility is given:
// in the lambdadedup adapters, the record of the batch (an SQS message,
// a Kinesis or DynamoDB Streams record, as makeIdempotent around a batch
// processor's record handler sees it) or the EventBridge event; anywhere
// else, the message's payload as JSON. Powertools' JMESPath functions
// powertools_json, powertools_base64 and powertools_base64_gzip are
// supported at the head of the expression or of a pipe's stage (as in
// "powertools_json(body).order_id" or "detail | powertools_json(payload)");
// New refuses them elsewhere, with how to write the expression instead.
package powertools

import (
	"bytes"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"math"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/events"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
)

// Runtime is the Powertools for AWS Lambda runtime whose keys Keys
// reproduces.
type Runtime int

const (
	// TypeScript: @aws-lambda-powertools/idempotency 2.x.
	TypeScript Runtime = iota + 1
	// Python: aws-lambda-powertools 3.x.
	Python
)

func (r Runtime) String() string {
	switch r {
	case TypeScript:
		return "TypeScript"
	case Python:
		return "Python"
	}
	return fmt.Sprintf("Runtime(%d)", int(r))
}

// Config configures Keys, as the Powertools function's IdempotencyConfig
// is configured.
type Config struct {
	// Runtime is the Powertools runtime to agree with. Required.
	Runtime Runtime

	// Prefix is what Powertools puts before "#" in its keys, for
	// IdempotencyKey. TypeScript: the keyPrefix option of makeIdempotent,
	// else the function's name (AWS_LAMBDA_FUNCTION_NAME). Python:
	// "<function name>.<module>.<qualified name of the decorated
	// function>", e.g. "charge-orders.app.lambda_handler". Give the dedup
	// scope the same value. Optional: Key and Fingerprint do not use it.
	Prefix string

	// EventKeyJMESPath selects the part of the event that identifies it:
	// IdempotencyConfig's eventKeyJmesPath (TypeScript) or
	// event_key_jmespath (Python). Empty: the whole event.
	EventKeyJMESPath string

	// PayloadValidationJMESPath selects what Fingerprint hashes:
	// payloadValidationJmesPath (TypeScript), payload_validation_jmespath
	// (Python). Empty: Fingerprint returns "" (no check), as Powertools
	// stores no validation hash then.
	PayloadValidationJMESPath string

	// HashFunction is hashFunction (TypeScript) or hash_function (Python):
	// "md5", "sha1", "sha256" or "sha512". Defaults to "md5", Powertools'
	// default.
	HashFunction string
}

// Keys computes a Powertools function's idempotency keys. Create it with
// New; it is safe for concurrent use.
type Keys struct {
	cfg        Config
	key        *expr // nil: the whole event
	validation *expr // nil: no validation hash
	newHash    func() hash.Hash
}

// New validates config, compiles its JMESPath expressions and returns
// Keys. An expression that does not compile, or uses a Powertools
// function where it is not supported (see the package documentation), is
// refused here.
func New(config Config) (*Keys, error) {
	var errs []error
	if config.Runtime != TypeScript && config.Runtime != Python {
		errs = append(errs, fmt.Errorf("powertools: Config.Runtime is required (TypeScript or Python), got %d", config.Runtime))
	}
	k := &Keys{cfg: config}
	switch config.HashFunction {
	case "", "md5":
		k.newHash = md5.New
	case "sha1":
		k.newHash = sha1.New
	case "sha256":
		k.newHash = sha256.New
	case "sha512":
		k.newHash = sha512.New
	default:
		errs = append(errs, fmt.Errorf("powertools: Config.HashFunction %q is not supported (md5, sha1, sha256, sha512)", config.HashFunction))
	}
	var err error
	if config.EventKeyJMESPath != "" {
		if k.key, err = compile(config.EventKeyJMESPath, config.Runtime); err != nil {
			errs = append(errs, fmt.Errorf("powertools: Config.EventKeyJMESPath: %w", err))
		}
	}
	if config.PayloadValidationJMESPath != "" {
		if k.validation, err = compile(config.PayloadValidationJMESPath, config.Runtime); err != nil {
			errs = append(errs, fmt.Errorf("powertools: Config.PayloadValidationJMESPath: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return k, nil
}

// Key is a dedup.Config.Key: the hash part of the message's Powertools
// idempotency key (everything after "#"), computed from the event the
// message came from (see the package documentation). A selection that
// Powertools would not make idempotent, or only under a key shared by
// every such event (null, missing, empty, or as TypeScript counts it
// falsy: false, 0, an object or array of only such values), is an error
// matching dedup.ErrNoKey: never a claim under a junk key. So is an event
// that is not JSON, or a Powertools function that fails on it (not a
// string, not base64, not JSON, not valid UTF-8). A selection equal to the
// message's transport id (its UUID, the record's SQS messageId, Kinesis
// or DynamoDB Streams event id, the EventBridge event id) is an error
// matching dedup.ErrTransportKey: its hash differs on every copy of the
// business fact. Cost: one JSON decoding of the event and one hash.
func (k *Keys) Key(msg *message.Message) (string, error) {
	data, ids, err := eventOf(msg, k.cfg.Runtime)
	if err != nil {
		return "", keyError(k.cfg.EventKeyJMESPath, "not JSON", msg, err)
	}
	sel, err := k.key.search(data)
	if err != nil {
		return "", keyError(k.cfg.EventKeyJMESPath, "selection failed", msg, err)
	}
	if k.missing(sel) {
		return "", keyError(k.cfg.EventKeyJMESPath, "missing, null, empty or falsy", msg, nil)
	}
	if s, ok := sel.(string); ok {
		for _, id := range append(ids, msg.UUID) {
			if id != "" && s == id {
				return "", fmt.Errorf("%w: powertools: %s selects the transport id %q of message %s", dedup.ErrTransportKey, k.cfg.EventKeyJMESPath, id, msg.UUID)
			}
		}
	}
	return k.hash(sel)
}

// Fingerprint is a dedup.Config.Fingerprint: Powertools' payload hash of
// PayloadValidationJMESPath's selection, which it keeps in the record's
// validation attribute; "" when PayloadValidationJMESPath is empty. A
// record with another payload hash is then dedup.ErrKeyReuse here, and
// IdempotencyValidationError in the Powertools function (which, unlike
// dedup, also refuses a record that has none when it validates). Errors
// as Key's, except that any selection, null included, is hashed.
func (k *Keys) Fingerprint(msg *message.Message) (string, error) {
	if k.validation == nil {
		return "", nil
	}
	data, _, err := eventOf(msg, k.cfg.Runtime)
	if err != nil {
		return "", keyError(k.cfg.PayloadValidationJMESPath, "not JSON", msg, err)
	}
	sel, err := k.validation.search(data)
	if err != nil {
		return "", keyError(k.cfg.PayloadValidationJMESPath, "selection failed", msg, err)
	}
	return k.hash(sel)
}

// IdempotencyKey returns the whole key a Powertools function writes for
// event (its JSON): "<Prefix>#<hash>", the partition key of its record.
// Errors as Key's, without the transport id check.
func (k *Keys) IdempotencyKey(event []byte) (string, error) {
	data, err := decode(event, k.cfg.Runtime)
	if err != nil {
		return "", fmt.Errorf("%w: powertools: the event is not JSON: %w", dedup.ErrNoKey, err)
	}
	sel, err := k.key.search(data)
	if err != nil {
		return "", fmt.Errorf("%w: powertools: %s: %w", dedup.ErrNoKey, k.cfg.EventKeyJMESPath, err)
	}
	if k.missing(sel) {
		return "", fmt.Errorf("%w: powertools: %s selects nothing usable", dedup.ErrNoKey, k.cfg.EventKeyJMESPath)
	}
	h, err := k.hash(sel)
	if err != nil {
		return "", err
	}
	return k.cfg.Prefix + "#" + h, nil
}

// hash is the runtime's digest of v's canonical JSON.
func (k *Keys) hash(v any) (string, error) {
	var buf bytes.Buffer
	var err error
	if k.cfg.Runtime == Python {
		err = writePython(&buf, v)
	} else {
		err = writeJS(&buf, deepSortKeys(v))
	}
	if err != nil {
		return "", fmt.Errorf("%w: powertools: %w", dedup.ErrNoKey, err)
	}
	h := k.newHash()
	h.Write(buf.Bytes())
	if k.cfg.Runtime == Python {
		return hex.EncodeToString(h.Sum(nil)), nil
	}
	return base64.StdEncoding.EncodeToString(h.Sum(nil)), nil
}

// missing is Powertools' isMissingIdempotencyKey (TypeScript) or
// is_missing_idempotency_key (Python), and null, which either runtime
// runs without idempotency.
func (k *Keys) missing(v any) bool {
	if k.cfg.Runtime == Python {
		switch v := v.(type) {
		case nil:
			return true
		case map[string]any:
			return len(v) == 0 // Python tests the keys, never None
		case []any:
			for _, e := range v {
				if e != nil {
					return false
				}
			}
			return true
		case string:
			return v == ""
		}
		return false // numbers and booleans, 0 and False included
	}
	switch v := v.(type) {
	case nil:
		return true
	case map[string]any:
		for _, e := range v {
			if truthy(e) {
				return false
			}
		}
		return true
	case []any:
		for _, e := range v {
			if truthy(e) {
				return false
			}
		}
		return true
	}
	return !truthy(v)
}

// truthy is JavaScript's truthiness of a JSON value.
func truthy(v any) bool {
	switch v := v.(type) {
	case nil:
		return false
	case bool:
		return v
	case float64:
		return v != 0 && !math.IsNaN(v)
	case string:
		return v != ""
	}
	return true // objects and arrays
}

func keyError(field, reason string, msg *message.Message, err error) error {
	return &dedup.KeyError{Field: "powertools:" + field, Reason: reason, MessageUUID: msg.UUID, Err: err}
}

// eventOf returns what the Powertools function's utility would see for
// msg, decoded, and the transport ids of that event.
func eventOf(msg *message.Message, rt Runtime) (any, []string, error) {
	ctx := msg.Context()
	var (
		raw []byte
		ids []string
		err error
	)
	if r, ok := lambdadedup.RecordFromContext(ctx); ok {
		raw, err = json.Marshal(r)
		ids = []string{r.MessageId}
	} else if r, ok := lambdadedup.KinesisRecordFromContext(ctx); ok {
		raw, err = json.Marshal(r)
		ids = []string{r.EventID, r.Kinesis.SequenceNumber}
	} else if r, ok := lambdadedup.DynamoDBRecordFromContext(ctx); ok {
		raw, err = json.Marshal(r)
		ids = []string{r.EventID, r.Change.SequenceNumber}
	} else if e, ok := lambdadedup.EventBridgeEventFromContext(ctx); ok {
		raw, err = json.Marshal(eventBridgeJSON(e))
		ids = []string{e.ID}
	} else {
		raw = msg.Payload
	}
	if err != nil {
		return nil, nil, err
	}
	v, err := decode(raw, rt)
	return v, ids, err
}

// eventBridgeJSON is an EventBridge event with detail as the JSON value it
// is in the event, not a string.
func eventBridgeJSON(e events.EventBridgeEvent) any {
	return struct {
		events.EventBridgeEvent
		Detail json.RawMessage `json:"detail"`
	}{e, e.Detail}
}

// decode parses JSON as the runtime's own JSON.parse or json.loads does:
// TypeScript numbers are doubles (float64; out of range: ±Infinity);
// Python numbers keep their text (json.Number), integers exact.
func decode(raw []byte, rt Runtime) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("more than one JSON value")
	}
	if rt == Python {
		return v, nil
	}
	return toDoubles(v), nil
}

// toDoubles turns every json.Number into the float64 JSON.parse makes of
// it.
func toDoubles(v any) any {
	switch v := v.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return math.NaN() // cannot happen: the decoder checked the number
		}
		return f // ±Inf or 0 when out of range, as JSON.parse
	case []any:
		for i, e := range v {
			v[i] = toDoubles(e)
		}
	case map[string]any:
		for k, e := range v {
			v[k] = toDoubles(e)
		}
	}
	return v
}
