package redis_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// No Redis 6 binary is at hand, so this one test (of New's refusal, not of
// the store) talks to a stub on a loopback port that answers INFO as a Redis
// 6.2 server would, and refuses HELLO as Redis 5 does. Every store behaviour
// is tested against real redis-server processes.
func TestNewRefusesOldServer(t *testing.T) {
	addr := startOldServerStub(t, "6.2.14")
	client := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store, err := redis.New(ctx, redis.Config{Client: client})
	if !errors.Is(err, redis.ErrServerTooOld) {
		t.Fatalf("New against Redis 6.2: %v, %v; want ErrServerTooOld", store, err)
	}
	var verr *redis.VersionError
	if !errors.As(err, &verr) || verr.Version != "6.2.14" || verr.Addr != addr {
		t.Fatalf("error %v: want a *VersionError for %s version 6.2.14", err, addr)
	}
}

// An unreachable server fails New, not the first message.
func TestNewUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens on addr now
	client := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := redis.New(ctx, redis.Config{Client: client}); err == nil || errors.Is(err, redis.ErrServerTooOld) {
		t.Fatalf("New against a closed port: %v, want a connection error", err)
	}
}

// New on the real 7.x servers: a single server here, a Cluster in
// TestConformanceCluster.
func TestNewAcceptsRedis7(t *testing.T) {
	client := newClient(t)
	if _, err := redis.New(context.Background(), redis.Config{Client: client}); err != nil {
		t.Fatal(err)
	}
}

// startOldServerStub serves just enough RESP2 for go-redis to connect and
// ask INFO.
func startOldServerStub(t *testing.T, version string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				serveOldRedis(conn, version)
			}()
		}
	}()
	return ln.Addr().String()
}

func serveOldRedis(conn net.Conn, version string) {
	r := bufio.NewReader(conn)
	for {
		args, err := readCommand(r)
		if err != nil {
			return
		}
		var reply string
		switch strings.ToUpper(args[0]) {
		case "HELLO":
			reply = "-ERR unknown command 'HELLO'\r\n"
		case "INFO":
			info := "# Server\r\nredis_version:" + version + "\r\nredis_mode:standalone\r\n"
			reply = fmt.Sprintf("$%d\r\n%s\r\n", len(info), info)
		case "PING":
			reply = "+PONG\r\n"
		case "CLIENT", "SELECT":
			reply = "+OK\r\n"
		default:
			reply = "-ERR unknown command '" + args[0] + "'\r\n"
		}
		if _, err := io.WriteString(conn, reply); err != nil {
			return
		}
	}
}

// readCommand reads one RESP array of bulk strings.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(line, "*") {
		return nil, fmt.Errorf("not an array: %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil || n < 1 {
		return nil, fmt.Errorf("bad array length %q", line)
	}
	args := make([]string, n)
	for i := range args {
		head, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
		if err != nil {
			return nil, fmt.Errorf("bad bulk length %q", head)
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		args[i] = string(buf[:size])
	}
	return args, nil
}
