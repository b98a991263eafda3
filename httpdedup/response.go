package httpdedup

import (
	"encoding/binary"
	"fmt"
	"net/http"
	"sort"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/replay"
)

// responseFormatV1 is the first byte of an encoded response.
const responseFormatV1 = 1

// Response is a stored response: what a completed record holds as its
// result, and what a replay sends.
type Response struct {
	// Status is the final status code (200-999; 1xx are never stored).
	Status int
	// Header holds the stored headers (Config.StoredHeaders), canonical
	// names, values in the order the handler set them.
	Header http.Header
	// Body is the response body, byte for byte.
	Body []byte
}

// EncodeResponse encodes a response into the compact, binary-safe,
// versioned form stored as the record's result:
//
//	byte    format version, 1
//	uvarint status
//	uvarint number of header fields, then for each field (names sorted,
//	        values of one name in order): uvarint length + name,
//	        uvarint length + value
//	...     the body: every remaining byte
//
// Storing the body last and unprefixed costs nothing for large bodies; a
// 201 with a JSON body and its Content-Type and Location costs about 40
// bytes more than the body.
func EncodeResponse(resp Response) []byte {
	names := make([]string, 0, len(resp.Header))
	size := 1 + 2*binary.MaxVarintLen64 + len(resp.Body)
	for name, values := range resp.Header {
		names = append(names, name)
		for _, v := range values {
			size += 2*binary.MaxVarintLen64 + len(name) + len(v)
		}
	}
	sort.Strings(names)
	b := make([]byte, 0, size)
	b = append(b, responseFormatV1)
	b = binary.AppendUvarint(b, uint64(resp.Status))
	fields := 0
	for _, name := range names {
		fields += len(resp.Header[name])
	}
	b = binary.AppendUvarint(b, uint64(fields))
	for _, name := range names {
		for _, v := range resp.Header[name] {
			b = binary.AppendUvarint(b, uint64(len(name)))
			b = append(b, name...)
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return append(b, resp.Body...)
}

// DecodeResponse decodes what EncodeResponse produced. Malformed input
// (empty, unknown version, truncated, status outside 200-999) gives an
// error wrapping dedup.ErrCorruptResult, never a panic. The returned body
// does not alias b.
func DecodeResponse(b []byte) (Response, error) {
	if len(b) == 0 {
		return Response{}, fmt.Errorf("%w: empty", dedup.ErrCorruptResult)
	}
	if b[0] != responseFormatV1 {
		return Response{}, fmt.Errorf("%w: unknown response format version %d", dedup.ErrCorruptResult, b[0])
	}
	d := replay.Decoder{B: b[1:]}
	status := d.Uvarint()
	fields := d.Uvarint()
	if d.Err == nil && (status < 200 || status > 999) {
		d.Err = fmt.Errorf("status %d", status)
	}
	if d.Err == nil && fields > uint64(len(d.B))/2 { // every field takes at least two bytes
		d.Err = replay.ErrTruncated
	}
	if d.Err != nil {
		return Response{}, fmt.Errorf("%w: %v", dedup.ErrCorruptResult, d.Err)
	}
	header := make(http.Header, fields)
	for i := uint64(0); d.Err == nil && i < fields; i++ {
		name := d.Bytes()
		value := d.Bytes()
		if d.Err == nil {
			header[string(name)] = append(header[string(name)], string(value))
		}
	}
	if d.Err != nil {
		return Response{}, fmt.Errorf("%w: %v", dedup.ErrCorruptResult, d.Err)
	}
	return Response{Status: int(status), Header: header, Body: append([]byte{}, d.B...)}, nil
}
