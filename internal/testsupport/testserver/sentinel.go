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
	return StartRedisSentinelWith(masterAddr, masterName, SentinelOptions{})
}

// SentinelOptions tunes StartRedisSentinelWith.
type SentinelOptions struct {
	// DownAfter is `sentinel down-after-milliseconds`: how long the master
	// must be unreachable before it is considered down. Defaults to 1s.
	DownAfter time.Duration
	// FailoverTimeout is `sentinel failover-timeout`. Defaults to Redis'
	// own (3 minutes).
	FailoverTimeout time.Duration
	// Replicas is how many replicas the Sentinel must have discovered
	// (SENTINEL REPLICAS) before StartRedisSentinelWith returns, so that it
	// can fail over at once. Defaults to 0.
	Replicas int
}

// StartRedisSentinelWith is StartRedisSentinel with options: a short
// DownAfter and FailoverTimeout make a killed master be replaced by one of
// its replicas within about a second (quorum 1, one Sentinel).
func StartRedisSentinelWith(masterAddr, masterName string, opts SentinelOptions) (*RedisSentinel, error) {
	if opts.DownAfter <= 0 {
		opts.DownAfter = time.Second
	}
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
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s %d\n",
			ports[0], dir, masterName, host, port, masterName, opts.DownAfter.Milliseconds())
		if opts.FailoverTimeout > 0 {
			body += fmt.Sprintf("sentinel failover-timeout %s %d\n", masterName, opts.FailoverTimeout.Milliseconds())
		}
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			return err
		}
		p, err := launch(launchSpec{name: "redis-sentinel " + s.Addr, path: bin, args: []string{conf, "--sentinel"}, dir: dir})
		if err != nil {
			return err
		}
		if err := p.waitReady(10*time.Second, func() error {
			if err := s.reportsMaster(masterAddr); err != nil {
				return err
			}
			return s.knowsReplicas(opts.Replicas)
		}); err != nil {
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

// knowsReplicas returns nil once the Sentinel lists at least n replicas of
// its master.
func (s *RedisSentinel) knowsReplicas(n int) error {
	if n == 0 {
		return nil
	}
	reply, err := redisDo(s.Addr, time.Second, "SENTINEL", "replicas", s.MasterName)
	if err != nil {
		return err
	}
	if a, ok := reply.([]any); !ok || len(a) < n {
		return fmt.Errorf("sentinel lists replicas %v, want %d", reply, n)
	}
	return nil
}

// MasterAddr returns the address the Sentinel currently reports for its
// master (SENTINEL get-master-addr-by-name).
func (s *RedisSentinel) MasterAddr() (string, error) {
	reply, err := redisDo(s.Addr, time.Second, "SENTINEL", "get-master-addr-by-name", s.MasterName)
	if err != nil {
		return "", err
	}
	if a, ok := reply.([]any); ok && len(a) == 2 {
		return fmt.Sprintf("%v:%v", a[0], a[1]), nil
	}
	return "", fmt.Errorf("sentinel reports master %v", reply)
}

// WaitMaster waits up to timeout until the Sentinel reports want as its
// master, for example after a failover, and want itself has role:master.
func (s *RedisSentinel) WaitMaster(want string, timeout time.Duration) error {
	return waitUntil(timeout, "Sentinel "+s.Addr+" to report master "+want, func() error {
		if err := s.reportsMaster(want); err != nil {
			return err
		}
		// get-master-addr-by-name reports the promoted replica before the
		// failover has ended: wait for the end too (flags exactly "master").
		reply, err := redisDo(s.Addr, time.Second, "SENTINEL", "master", s.MasterName)
		if err != nil {
			return err
		}
		fields, _ := reply.([]any)
		for i := 0; i+1 < len(fields); i += 2 {
			if fields[i] == "flags" && fields[i+1] != "master" {
				return fmt.Errorf("sentinel flags the master %v", fields[i+1])
			}
		}
		info, err := infoReplication(want)
		if err != nil {
			return err
		}
		if role := redisInfoField(info, "role"); role != "master" {
			return fmt.Errorf("%s has role:%s", want, role)
		}
		return nil
	})
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

// Output returns the last lines the Sentinel printed (its +sdown,
// +switch-master and other events).
func (s *RedisSentinel) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return ""
	}
	return s.proc.out.Tail(8192)
}
