package testserver

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// RedisSentinel is a Redis Sentinel child process on 127.0.0.1 that monitors
// one master (quorum 1), for tests of clients that find the master through
// Sentinel (go-redis' FailoverClient).
type RedisSentinel struct {
	// Addr is the Sentinel's "127.0.0.1:port".
	Addr string
	// MasterName is the name the master is monitored under.
	MasterName string

	dir  string
	mu   sync.Mutex
	proc *process
}

// StartRedisSentinel starts `redis-server <conf> --sentinel` on a free port,
// monitoring masterAddr ("127.0.0.1:port") under masterName, and returns once
// it reports that master. Call Close when done.
func StartRedisSentinel(masterAddr, masterName string) (*RedisSentinel, error) {
	bin, err := redisBinary()
	if err != nil {
		return nil, err
	}
	host, port, ok := cutLast(masterAddr, ':')
	if !ok {
		return nil, fmt.Errorf("testserver: master address %q is not host:port", masterAddr)
	}
	dir, err := os.MkdirTemp("", "testserver-sentinel-*")
	if err != nil {
		return nil, err
	}
	s := &RedisSentinel{MasterName: masterName, dir: dir}
	err = withFreshPorts(1, func(ports []int) error {
		s.Addr = fmt.Sprintf("127.0.0.1:%d", ports[0])
		conf := filepath.Join(dir, "sentinel.conf")
		// Sentinel rewrites its configuration file, so it must be writable.
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s 1000\n",
			ports[0], dir, masterName, host, port, masterName)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			return err
		}
		p, err := launch(launchSpec{name: "redis-sentinel " + s.Addr, path: bin, args: []string{conf, "--sentinel"}, dir: dir})
		if err != nil {
			return err
		}
		if err := p.waitReady(10*time.Second, func() error { return s.reportsMaster(masterAddr) }); err != nil {
			_ = p.kill()
			return err
		}
		s.proc = p
		return nil
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// reportsMaster asks the Sentinel for the master's address.
func (s *RedisSentinel) reportsMaster(want string) error {
	reply, err := redisDo(s.Addr, time.Second, "SENTINEL", "get-master-addr-by-name", s.MasterName)
	if err != nil {
		return err
	}
	if a, ok := reply.([]any); ok && len(a) == 2 {
		if got := fmt.Sprintf("%v:%v", a[0], a[1]); got == want {
			return nil
		}
	}
	return fmt.Errorf("sentinel reports master %v, want %s", reply, want)
}

// Close kills the Sentinel and removes its directory. It may be called more
// than once.
func (s *RedisSentinel) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		_ = s.proc.kill()
		s.proc = nil
	}
	return os.RemoveAll(s.dir)
}

func cutLast(s string, sep byte) (before, after string, ok bool) {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == sep {
			if _, err := strconv.Atoi(s[i+1:]); err != nil {
				return "", "", false
			}
			return s[:i], s[i+1:], true
		}
	}
	return "", "", false
}
