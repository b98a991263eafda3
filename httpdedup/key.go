package httpdedup

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-dedup/watermill-dedup/dedup"
)

// HeaderKey returns a KeyFunc reading the key from the request header name.
// It accepts the two forms in use:
//
//   - a structured-field string (RFC 8941 sf-string), as the IETF draft
//     specifies: Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324";
//     the escapes \" and \\ are decoded, nothing may follow the closing
//     quote (parameters are refused);
//   - a bare value, as Stripe's clients send it:
//     Idempotency-Key: 8e03978e-40d5-43e8-bc93-6894a57f9324.
//
// Both give the same key, so a client may switch forms between retries.
// Surrounding spaces and tabs are ignored. A missing header gives
// ErrKeyMissing; the header sent more than once, an empty value, a
// character outside printable ASCII or a broken quoted string gives
// ErrKeyInvalid. Either is a *dedup.KeyError whose Field is the header
// ("Idempotency-Key header") and whose Err is the sentinel, so it also
// matches dedup.ErrNoKey. It never reads the body.
func HeaderKey(name string) KeyFunc {
	name = http.CanonicalHeaderKey(name)
	field := name + " header"
	return func(r *http.Request, _ BodyFunc) (string, error) {
		values := r.Header.Values(name)
		switch len(values) {
		case 0:
			return "", keyError(ErrKeyMissing, field, "no "+field)
		case 1:
		default:
			return "", keyError(ErrKeyInvalid, field, fmt.Sprintf("%s sent %d times", field, len(values)))
		}
		key, err := ParseKey(values[0])
		var ke *dedup.KeyError
		if errors.As(err, &ke) {
			return "", keyError(ErrKeyInvalid, field, ke.Reason)
		}
		return key, nil
	}
}

// ParseKey decodes an idempotency key header value, quoted or bare, as
// HeaderKey describes. Its errors are *dedup.KeyError matching
// ErrKeyInvalid (and dedup.ErrNoKey), with the reason in Reason.
func ParseKey(value string) (string, error) {
	v := strings.Trim(value, " \t")
	if v == "" {
		return "", invalid("empty value")
	}
	if v[0] != '"' {
		for i := 0; i < len(v); i++ {
			if !printable(v[i]) {
				return "", invalid("byte 0x%02x at offset %d is not printable ASCII", v[i], i)
			}
		}
		return v, nil
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", invalid("bad escape in quoted string")
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", invalid("%q follows the closing quote", v[i+1:])
			}
			if b.Len() == 0 {
				return "", invalid("empty quoted string")
			}
			return b.String(), nil
		case !printable(c):
			return "", invalid("byte 0x%02x in quoted string is not printable ASCII", c)
		default:
			b.WriteByte(c)
		}
	}
	return "", invalid("quoted string has no closing quote")
}

func invalid(format string, args ...any) error {
	return keyError(ErrKeyInvalid, "", fmt.Sprintf(format, args...))
}

func printable(c byte) bool { return c >= 0x20 && c <= 0x7e }

// CheckKey reports whether a Middleware with the default Dedup.MaxKeyLength
// accepts key as a client sends it, the bare value of its Idempotency-Key
// header: nil, or a *dedup.KeyError (matching ErrKeyInvalid and dedup.ErrNoKey)
// saying why not. This is the HTTP key rule, stated once: 1 to 255 bytes
// of printable ASCII (0x20-0x7E), not blank, with no space at either end
// (a header value's are trimmed) and no leading '"' (it would read as a
// structured-field string). It is stricter than the engine's rule for
// message keys (UTF-8 without control characters, up to
// dedup.Config.MaxKeyLength, 1024 bytes by default). A client that stamps keys (producerkey.WithKey) checks them
// with it, so that a key every attempt would get 400 for is refused before
// it is sent. Cost: one pass over the key.
func CheckKey(key string) error {
	if err := checkKey(key, DefaultMaxKeyLength); err != nil {
		return err
	}
	v, err := ParseKey(key)
	if err != nil {
		return err
	}
	if v != key {
		return invalid("the header would carry %q, not the key itself (a space at either end, or a structured-field string)", v)
	}
	return nil
}

// checkKey applies the rules every key must pass, whatever KeyFunc made it
// (see CheckKey), with the Middleware's Dedup.MaxKeyLength.
func checkKey(key string, maxLen int) error {
	if strings.Trim(key, " ") == "" {
		return invalid("empty or blank key")
	}
	if len(key) > maxLen {
		return invalid("key is %d bytes, longer than %d", len(key), maxLen)
	}
	for i := 0; i < len(key); i++ {
		if !printable(key[i]) {
			return invalid("byte 0x%02x at offset %d is not printable ASCII", key[i], i)
		}
	}
	return nil
}

// BodyKey adapts a Watermill key function (package keyfuncs) to requests:
// fn sees a message whose payload is the request body. Webhook receivers use
// it to key on the provider's event id: BodyKey(keyfuncs.JSON("id")). Every
// error of fn matching dedup.ErrNoKey (absent field, null, wrong type, body
// not JSON) is returned as a *dedup.KeyError with fn's Field and Reason
// and an Err matching ErrKeyMissing and fn's error; a body over the limit
// gives ErrBodyTooLarge. It reads the body.
func BodyKey(fn func(msg *message.Message) (string, error)) KeyFunc {
	return func(_ *http.Request, body BodyFunc) (string, error) {
		b, err := body()
		if err != nil {
			return "", err
		}
		key, err := fn(message.NewMessage("", b))
		if err != nil {
			if !errors.Is(err, dedup.ErrNoKey) {
				return "", err
			}
			cause := fmt.Errorf("%w: %w", ErrKeyMissing, err)
			var ke *dedup.KeyError
			if errors.As(err, &ke) && ke.Field != "" && ke.Reason != "" {
				return "", keyError(cause, ke.Field, ke.Reason)
			}
			return "", keyError(cause, "", "no key in the request body")
		}
		return key, nil
	}
}

// DefaultRoute is the default RouteFunc: the ServeMux pattern that matched
// the request without its method ("/payments/{id}/refunds", the method is in
// the scope already), or, when no pattern is set (the middleware wraps a
// whole mux or is used without one), the request's escaped path.
func DefaultRoute(r *http.Request) string {
	if p := r.Pattern; p != "" {
		if _, rest, ok := strings.Cut(p, " "); ok {
			return strings.TrimLeft(rest, " \t")
		}
		return p
	}
	return r.URL.EscapedPath()
}

// DefaultFingerprint is the default FingerprintFunc: the hex SHA-256 of the
// method, the request target (escaped path and query) and the body, each
// length-prefixed so that no two requests share an encoding. The query is
// included because it changes what a request asks for (?capture=false).
// Headers are not: proxies add and rewrite them between retries.
func DefaultFingerprint(r *http.Request, body []byte) (string, error) {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, part := range [][]byte{[]byte("httpdedup/v1"), []byte(r.Method), []byte(r.URL.RequestURI()), body} {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(part)))])
		h.Write(part)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// NoFingerprint is a FingerprintFunc that disables the fingerprint check: a
// key reused with a different request replays the first response.
func NoFingerprint(*http.Request, []byte) (string, error) { return "", nil }

var scopeEscaper = strings.NewReplacer("%", "%25", " ", "%20")

// Scope returns the scope of a record, identity + " " + method + " " +
// route, each part with "%" and " " percent-encoded so that the parts
// cannot run into each other. The record's key is
// admin.ScopedKey(Scope(...), key). Exposed for tools that inspect or evict
// records.
func Scope(identity, method, route string) string {
	return scopeEscaper.Replace(identity) + " " + scopeEscaper.Replace(method) + " " + scopeEscaper.Replace(route)
}
