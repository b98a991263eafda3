// Package replay encodes the output messages of a handler for the record
// of its key, so that a duplicate can return them again.
package replay

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"

	"github.com/ThreeDotsLabs/watermill/message"
)

// formatV1 is the first byte of an encoded list of messages.
const formatV1 = 1

// Encode encodes messages (UUID, metadata, payload) into a compact,
// binary-safe, versioned form: one version byte, then for each message its
// UUID, its metadata pairs sorted by key and its payload, each prefixed by a
// uvarint length. It is what the middleware stores as the result when
// dedup.Config.Replay is on. A nil or empty list encodes to a single byte.
func Encode(msgs []*message.Message) []byte {
	size := 1 + binary.MaxVarintLen64
	for _, m := range msgs {
		size += 3*binary.MaxVarintLen64 + len(m.UUID) + len(m.Payload)
		for k, v := range m.Metadata {
			size += 2*binary.MaxVarintLen64 + len(k) + len(v)
		}
	}
	b := make([]byte, 0, size)
	b = append(b, formatV1)
	b = binary.AppendUvarint(b, uint64(len(msgs)))
	appendBytes := func(s []byte) { b = binary.AppendUvarint(b, uint64(len(s))); b = append(b, s...) }
	for _, m := range msgs {
		appendBytes([]byte(m.UUID))
		keys := make([]string, 0, len(m.Metadata))
		for k := range m.Metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b = binary.AppendUvarint(b, uint64(len(keys)))
		for _, k := range keys {
			appendBytes([]byte(k))
			appendBytes([]byte(m.Metadata[k]))
		}
		appendBytes(m.Payload)
	}
	return b
}

// ErrTruncated: an encoding ends in the middle of a field.
var ErrTruncated = errors.New("truncated")

// Decode decodes what Encode produced. Malformed input gives an error
// saying what is wrong, never a panic.
func Decode(b []byte) ([]*message.Message, error) {
	if len(b) == 0 {
		return nil, errors.New("empty")
	}
	if b[0] != formatV1 {
		return nil, fmt.Errorf("unknown format version %d", b[0])
	}
	d := Decoder{B: b[1:]}
	n := d.Uvarint()
	if d.Err == nil && n > uint64(len(d.B)) { // every message takes at least one byte
		d.Err = ErrTruncated
	}
	var msgs []*message.Message
	for i := uint64(0); d.Err == nil && i < n; i++ {
		uuid := string(d.Bytes())
		pairs := d.Uvarint()
		if d.Err == nil && pairs > uint64(len(d.B)) {
			d.Err = ErrTruncated
		}
		md := make(message.Metadata, pairs)
		for j := uint64(0); d.Err == nil && j < pairs; j++ {
			k := string(d.Bytes())
			md[k] = string(d.Bytes())
		}
		payload := bytes.Clone(d.Bytes())
		if d.Err != nil {
			break
		}
		m := message.NewMessage(uuid, payload)
		m.Metadata = md
		msgs = append(msgs, m)
	}
	if d.Err == nil && len(d.B) != 0 {
		d.Err = fmt.Errorf("%d trailing bytes", len(d.B))
	}
	if d.Err != nil {
		return nil, d.Err
	}
	return msgs, nil
}

// Decoder reads the uvarint-prefixed fields of an encoding. After the first
// problem every read returns zero values and Err says what was wrong. The
// HTTP response encoding (httpdedup) is read with it too.
type Decoder struct {
	// B is what is left to read.
	B []byte
	// Err is the first problem met, or nil.
	Err error
}

// Uvarint reads one uvarint.
func (d *Decoder) Uvarint() uint64 {
	if d.Err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.B)
	if n <= 0 {
		d.Err = ErrTruncated
		return 0
	}
	d.B = d.B[n:]
	return v
}

// Bytes reads one length-prefixed field; the result aliases the input.
func (d *Decoder) Bytes() []byte {
	n := d.Uvarint()
	if d.Err != nil {
		return nil
	}
	if n > uint64(len(d.B)) {
		d.Err = ErrTruncated
		return nil
	}
	out := d.B[:n:n]
	d.B = d.B[n:]
	return out
}
