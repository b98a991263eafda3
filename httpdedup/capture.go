package httpdedup

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
)

// captureWriter is the ResponseWriter the handler gets on a claimed request.
// It buffers the whole response, up to a limit, so that the record can be
// completed before the client sees the response, and so that a response
// that cannot be stored whole is never half-sent or half-stored.
//
// It implements http.Flusher, the FlushError method that
// http.ResponseController looks for, and http.Hijacker, only to refuse
// them: streaming and hijacked connections cannot be replayed. It has no
// Unwrap method, so http.ResponseController cannot reach the server's
// writer around it.
type captureWriter struct {
	header  http.Header
	sent    http.Header // the header as it was at WriteHeader
	status  int
	body    []byte
	limit   int
	refused error // why the response cannot be stored; nil while it can
	// overLimit: refused because the body passed the limit (the response
	// is whole otherwise: its effect may have happened).
	overLimit bool
}

var (
	_ http.Flusher  = (*captureWriter)(nil)
	_ http.Hijacker = (*captureWriter)(nil)
)

func newCaptureWriter(limit int) *captureWriter {
	return &captureWriter{header: http.Header{}, limit: limit}
}

func (c *captureWriter) refuse(err error) error {
	if c.refused == nil {
		c.refused = err
	}
	return c.refused
}

// Header returns the header map the handler sets.
func (c *captureWriter) Header() http.Header { return c.header }

// WriteHeader records the status. Informational statuses (1xx) are
// dropped: they are not part of the stored response. Like net/http, a
// status outside 100-999 panics and later calls are ignored.
func (c *captureWriter) WriteHeader(status int) {
	if status < 100 || status > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", status))
	}
	if c.status != 0 {
		return
	}
	if status == http.StatusSwitchingProtocols {
		c.refuse(fmt.Errorf("%w: 101 Switching Protocols", ErrNotStorable))
		return
	}
	if status < 200 {
		return
	}
	c.status = status
	c.sent = c.header.Clone() // later header changes do not reach the response, as in net/http
}

// Write buffers p. Past the limit it writes nothing and returns an error
// matching ErrNotStorable.
func (c *captureWriter) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if c.refused != nil {
		return 0, c.refused
	}
	if len(c.body)+len(p) > c.limit {
		return 0, c.overflow()
	}
	c.body = append(c.body, p...)
	return len(p), nil
}

// WriteString is Write for strings (io.StringWriter).
func (c *captureWriter) WriteString(s string) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if c.refused != nil {
		return 0, c.refused
	}
	if len(c.body)+len(s) > c.limit {
		return 0, c.overflow()
	}
	c.body = append(c.body, s...)
	return len(s), nil
}

// overflow refuses a body past the limit.
func (c *captureWriter) overflow() error {
	if c.refused == nil {
		c.overLimit = true
	}
	return c.refuse(fmt.Errorf("%w: the response body exceeds MaxResponseBytes (%d)", ErrNotStorable, c.limit))
}

// Flush refuses streaming: the response is marked not storable.
func (c *captureWriter) Flush() {
	c.refuse(fmt.Errorf("%w: the handler flushed (streaming responses cannot be replayed)", ErrNotStorable))
}

// FlushError is what http.ResponseController.Flush calls: it refuses
// streaming and says so.
func (c *captureWriter) FlushError() error {
	c.Flush()
	return c.refused
}

// Hijack refuses to hand over the connection.
func (c *captureWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, c.refuse(fmt.Errorf("%w: the handler hijacked the connection", ErrNotStorable))
}

// response returns the captured response, with every header the handler
// set, or the reason it cannot be stored.
// wrote reports whether the handler wrote a status or a body.
func (c *captureWriter) wrote() bool { return c.status != 0 }

func (c *captureWriter) response() (Response, error) {
	if c.refused != nil {
		return Response{}, c.refused
	}
	status, header := c.status, c.sent
	if status == 0 { // the handler wrote nothing: net/http sends 200
		status, header = http.StatusOK, c.header.Clone()
	}
	// net/http would sniff a missing Content-Type when the body is written;
	// do it here so that the stored response and the first one agree.
	if _, ok := header["Content-Type"]; !ok && len(c.body) > 0 && bodyAllowed(status) && header.Get("Content-Encoding") == "" {
		header.Set("Content-Type", http.DetectContentType(c.body))
	}
	return Response{Status: status, Header: header, Body: c.body}, nil
}

// bodyAllowed reports whether a response with this status may have a body
// (RFC 9110: not 1xx, 204 or 304).
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// writeResponse sends resp on w: its header fields (replacing any that
// outer handlers set with the same name), Content-Length, status and body.
func writeResponse(w http.ResponseWriter, resp Response) {
	h := w.Header()
	for name, values := range resp.Header {
		h[name] = values
	}
	if bodyAllowed(resp.Status) {
		h.Set("Content-Length", fmt.Sprint(len(resp.Body)))
	}
	w.WriteHeader(resp.Status)
	if len(resp.Body) > 0 && bodyAllowed(resp.Status) {
		_, _ = w.Write(resp.Body)
	}
}
