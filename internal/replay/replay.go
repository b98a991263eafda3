// Package replay encodes the output messages of a handler for the record
// of its key, so that a duplicate can return them again.
package replay

import (
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

var errTruncated = errors.New("truncated")

// Decode decodes what Encode produced. Malformed input gives an error
// saying what is wrong, never a panic.
func Decode(b []byte) ([]*message.Message, error) {
	if len(b) == 0 {
		return nil, errors.New("empty")
	}
	if b[0] != formatV1 {
		return nil, fmt.Errorf("unknown format version %d", b[0])
	}
	d := decoder{b: b[1:]}
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)) { // every message takes at least one byte
		d.err = errTruncated
	}
	var msgs []*message.Message
	for i := uint64(0); d.err == nil && i < n; i++ {
		uuid := string(d.bytes())
		pairs := d.uvarint()
		if d.err == nil && pairs > uint64(len(d.b)) {
			d.err = errTruncated
		}
		md := make(message.Metadata, pairs)
		for j := uint64(0); d.err == nil && j < pairs; j++ {
			k := string(d.bytes())
			md[k] = string(d.bytes())
		}
		payload := d.bytes()
		if d.err != nil {
			break
		}
		m := message.NewMessage(uuid, payload)
		m.Metadata = md
		msgs = append(msgs, m)
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	return msgs, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errTruncated
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = errTruncated
		return nil
	}
	out := make([]byte, n)
	copy(out, d.b[:n])
	d.b = d.b[n:]
	return out
}
