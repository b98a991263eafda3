package testserver

import (
	"fmt"
	"strings"
	"time"
)

// StartRedisReplica starts a redis-server that replicates master
// (--replicaof), without persistence like StartRedis and with
// --repl-diskless-sync-delay 0 (once promoted, it serves its own replicas at
// once instead of after Redis' default 5 s), and returns once its
// link to the master is up (master_link_status:up) and the master counts it
// among its connected replicas. Call Close when done.
func StartRedisReplica(master *Redis) (*Redis, error) {
	host, port, ok := cutLast(master.Addr, ':')
	if !ok {
		return nil, fmt.Errorf("testserver: master address %q is not host:port", master.Addr)
	}
	r, err := startRedis("redis-replica", func(string, []int) []string {
		return []string{"--replicaof", host, port, "--repl-diskless-sync-delay", "0"}
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

// WaitReplicaOf waits up to timeout until r replicates master with its link
// up and master lists it online: for example after a killed master was
// started again and Sentinel turned it into a replica of the new master.
func (r *Redis) WaitReplicaOf(master *Redis, timeout time.Duration) error {
	return waitUntil(timeout, r.Addr+" to replicate "+master.Addr, func() error {
		info, err := infoReplication(r.Addr)
		if err != nil {
			return err
		}
		_, port, _ := cutLast(master.Addr, ':')
		if got := redisInfoField(info, "master_port"); got != port {
			return fmt.Errorf("%s: role:%s master_port:%s", r.Addr, redisInfoField(info, "role"), got)
		}
		return replicaLinked(master.Addr, r.Addr)
	})
}

// StartAsReplicaOf starts a stopped or killed server again, on the same
// port, as a replica of master (--replicaof from its first moment, kept for
// later restarts), and waits up to timeout until it replicates master. This
// is how a master without persistence must come back after a failover: if it
// came back as a master, empty, clients could write to it before Sentinel
// demotes it.
func (r *Redis) StartAsReplicaOf(master *Redis, timeout time.Duration) error {
	host, port, ok := cutLast(master.Addr, ':')
	if !ok {
		return fmt.Errorf("testserver: master address %q is not host:port", master.Addr)
	}
	r.mu.Lock()
	r.extraArgs = append(r.extraArgs[:len(r.extraArgs):len(r.extraArgs)], "--replicaof", host, port, "--repl-diskless-sync-delay", "0")
	r.mu.Unlock()
	if err := r.Start(); err != nil {
		return err
	}
	return r.WaitReplicaOf(master, timeout)
}

// CutReplication cuts the replication link from master to replica and
// keeps it cut: the replica is made to authenticate to its master as a user
// that does not exist (CONFIG SET masteruser/masterauth), and the master
// drops its replica connections (CLIENT KILL TYPE replica), so the replica
// keeps answering clients and Sentinel but receives no more writes, while
// the master goes on acknowledging writes alone: the window asynchronous
// replication leaves, made wide enough to hit. It returns once the replica
// reports master_link_status:down. HealReplication undoes it.
func CutReplication(master, replica *Redis) error {
	for _, args := range [][]string{
		{"CONFIG", "SET", "masteruser", "testserver-cut-link"},
		{"CONFIG", "SET", "masterauth", "testserver-cut-link"},
	} {
		if _, err := redisDo(replica.Addr, time.Second, args...); err != nil {
			return fmt.Errorf("testserver: %s on %s: %w", strings.Join(args, " "), replica.Addr, err)
		}
	}
	if _, err := redisDo(master.Addr, time.Second, "CLIENT", "KILL", "TYPE", "replica"); err != nil {
		return fmt.Errorf("testserver: CLIENT KILL TYPE replica on %s: %w", master.Addr, err)
	}
	return waitUntil(10*time.Second, replica.Addr+" to report master_link_status:down", func() error {
		info, err := infoReplication(replica.Addr)
		if err != nil {
			return err
		}
		if s := redisInfoField(info, "master_link_status"); s != "down" {
			return fmt.Errorf("master_link_status:%s", s)
		}
		return nil
	})
}

// HealReplication lets replica authenticate to its master again (an empty
// masterauth) after CutReplication.
func HealReplication(replica *Redis) error {
	for _, args := range [][]string{{"CONFIG", "SET", "masterauth", ""}, {"CONFIG", "SET", "masteruser", ""}} {
		if _, err := redisDo(replica.Addr, time.Second, args...); err != nil {
			return fmt.Errorf("testserver: %s on %s: %w", strings.Join(args, " "), replica.Addr, err)
		}
	}
	return nil
}
