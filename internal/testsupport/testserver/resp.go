package testserver

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// respError is a RESP error reply ("-ERR ...").
type respError string

func (e respError) Error() string { return string(e) }

// redisDo sends one command to the Redis server at addr over a fresh
// connection and returns its reply: string (simple or bulk), int64, nil
// (null), []any, or a respError as the error.
func redisDo(addr string, timeout time.Duration, args ...string) (any, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(c, b.String()); err != nil {
		return nil, err
	}
	return readRESP(bufio.NewReader(c))
}

func readRESP(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, fmt.Errorf("resp: empty line")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, respError(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, fmt.Errorf("resp: bad bulk length %q", body)
		}
		if n < 0 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, fmt.Errorf("resp: bad array length %q", body)
		}
		if n < 0 {
			return nil, nil
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = readRESP(r); err != nil {
				return nil, err
			}
		}
		return out, nil
	default:
		return nil, fmt.Errorf("resp: unexpected reply %q", line)
	}
}

// pingRedis returns nil when the server at addr answers PONG.
func pingRedis(addr string) error {
	v, err := redisDo(addr, time.Second, "PING")
	if err != nil {
		return err
	}
	if v != "PONG" {
		return fmt.Errorf("PING answered %v", v)
	}
	return nil
}

// redisInfoField returns field from an INFO-style "key:value" text.
func redisInfoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == field {
			return v
		}
	}
	return ""
}
