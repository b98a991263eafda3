package testserver

import (
	"fmt"
	"strings"
	"time"
)

// StartRedisReplica starts a redis-server that replicates master
// (--replicaof), without persistence like StartRedis, and returns once its
// link to the master is up (master_link_status:up) and the master counts it
// among its connected replicas. Call Close when done.
func StartRedisReplica(master *Redis) (*Redis, error) {
	host, port, ok := cutLast(master.Addr, ':')
	if !ok {
		return nil, fmt.Errorf("testserver: master address %q is not host:port", master.Addr)
	}
	r, err := startRedis("redis-replica", func(string, []int) []string {
		return []string{"--replicaof", host, port}
	}, 1)
	if err != nil {
		return nil, err
	}
	if err := waitUntil(10*time.Second, "the replica "+r.Addr+" to report master_link_status:up", func() error {
		return replicaLinked(master.Addr, r.Addr)
	}); err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

// replicaLinked returns nil once replica reports its link to the master up
// and the master lists the replica online.
func replicaLinked(masterAddr, replicaAddr string) error {
	info, err := infoReplication(replicaAddr)
	if err != nil {
		return err
	}
	if s := redisInfoField(info, "master_link_status"); s != "up" {
		return fmt.Errorf("%s: master_link_status:%s", replicaAddr, s)
	}
	minfo, err := infoReplication(masterAddr)
	if err != nil {
		return err
	}
	_, port, _ := cutLast(replicaAddr, ':')
	if !strings.Contains(minfo, "port="+port+",state=online") {
		return fmt.Errorf("%s does not list %s online: %s", masterAddr, replicaAddr, strings.Join(strings.Fields(minfo), " "))
	}
	return nil
}

func infoReplication(addr string) (string, error) {
	v, err := redisDo(addr, time.Second, "INFO", "replication")
	if err != nil {
		return "", fmt.Errorf("%s: INFO replication: %w", addr, err)
	}
	s, _ := v.(string)
	return s, nil
}

// Role returns the server's INFO replication role: "master" or "slave".
func (r *Redis) Role() (string, error) {
	info, err := infoReplication(r.Addr)
	if err != nil {
		return "", err
	}
	return redisInfoField(info, "role"), nil
}

// WaitRole waits up to timeout until the server's role is role ("master"
// or "slave"), for example until a replica has been promoted.
func (r *Redis) WaitRole(role string, timeout time.Duration) error {
	return waitUntil(timeout, r.Addr+" to have role:"+role, func() error {
		got, err := r.Role()
		if err != nil {
			return err
		}
		if got != role {
			return fmt.Errorf("role:%s", got)
		}
		return nil
	})
}

// running reports whether the server's process is alive.
func (r *Redis) running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc != nil && !r.proc.exited() && !r.closed
}

// waitUntil polls probe every 50ms until it returns nil; after timeout it
// returns an error saying what was awaited and the probe's last error.
func waitUntil(timeout time.Duration, what string, probe func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := probe()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testserver: timed out after %v waiting for %s: %v", timeout, what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
