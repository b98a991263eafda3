package testserver

import (
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// StartRedisClusterWithReplicas starts a Redis Cluster of masters masters
// (at least 3) with one replica each: 2*masters redis-server nodes in
// cluster mode with --cluster-node-timeout nodeTimeout (a master that is
// unreachable that long is failed over to its replica) and
// --repl-diskless-sync-delay 0, joined with
// `redis-cli --cluster create ... --cluster-replicas 1`. It returns once
// every node reports cluster_state:ok, every node lists every replica with
// its master, and every replica's link to its master is up. In the result,
// Addrs and Nodes hold every node, masters and replicas; Masters, ReplicaOf
// and ClusterNodes tell them apart. Call Close when done.
func StartRedisClusterWithReplicas(masters int, nodeTimeout time.Duration) (*RedisCluster, error) {
	if masters < 3 {
		return nil, fmt.Errorf("testserver: StartRedisClusterWithReplicas(%d): redis-cli needs at least 3 masters", masters)
	}
	if nodeTimeout <= 0 {
		return nil, fmt.Errorf("testserver: StartRedisClusterWithReplicas: node timeout %v must be positive", nodeTimeout)
	}
	cli, err := lookPath("redis-cli", redisFix)
	if err != nil {
		return nil, err
	}
	c := &RedisCluster{}
	for i := 0; i < 2*masters; i++ {
		n, err := startRedis("redis-cluster", func(dir string, ports []int) []string {
			return []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", fmt.Sprintf("%s/nodes-%d.conf", dir, ports[0]),
				"--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10),
				"--cluster-port", strconv.Itoa(ports[1]),
				"--repl-diskless-sync-delay", "0",
			}
		}, 2)
		if err != nil {
			_ = c.Close()
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
		c.Addrs = append(c.Addrs, n.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := runCmd(exec.Command(cli, args...), time.Minute); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("testserver: redis-cli --cluster create --cluster-replicas 1: %v; its output:\n%s", err, out)
	}
	if err := c.waitOK(30 * time.Second); err == nil {
		err = waitUntil(30*time.Second, "every node to list every replica, and every replica's link to its master", func() error {
			var replicas []ClusterNode
			for _, node := range c.Nodes {
				nodes, err := clusterNodesOf(node.Addr)
				if err != nil {
					return fmt.Errorf("%s: CLUSTER NODES: %w", node.Addr, err)
				}
				if replicas = knownReplicas(nodes); len(replicas) != masters {
					return fmt.Errorf("%s lists %d replicas, want %d", node.Addr, len(replicas), masters)
				}
			}
			for _, r := range replicas {
				info, err := infoReplication(r.Addr)
				if err != nil {
					return err
				}
				if s := redisInfoField(info, "master_link_status"); s != "up" {
					return fmt.Errorf("%s: master_link_status:%s", r.Addr, s)
				}
			}
			return nil
		})
		if err != nil {
			_ = c.Close()
			return nil, err
		}
	} else {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// ClusterNode is one line of CLUSTER NODES.
type ClusterNode struct {
	ID, Addr string
	Master   bool   // flags include "master"
	Myself   bool   // the line of the node that answered
	Failed   bool   // flags include "fail" or "fail?"
	MasterID string // a replica's master, "" for a master
	Slots    []string
}

// ClusterNodes returns the cluster's nodes as the first running node sees
// them (CLUSTER NODES).
func (c *RedisCluster) ClusterNodes() ([]ClusterNode, error) {
	var last error
	for _, n := range c.Nodes {
		if !n.running() {
			continue
		}
		nodes, err := clusterNodesOf(n.Addr)
		if err != nil {
			last = err
			continue
		}
		return nodes, nil
	}
	if last == nil {
		last = errors.New("no node is running")
	}
	return nil, fmt.Errorf("testserver: CLUSTER NODES: %w", last)
}

// clusterNodesOf returns the cluster's nodes as the node at addr sees them.
// Each node learns of the others' roles by gossip: right after the cluster
// is made, or on a loaded machine, one node may still list a replica as a
// master of no slots while the replica itself knows its master.
func clusterNodesOf(addr string) ([]ClusterNode, error) {
	v, err := redisDo(addr, time.Second, "CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	text, _ := v.(string)
	var out []ClusterNode
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		flags := "," + f[2] + ","
		cn := ClusterNode{ID: f[0], Addr: addr,
			Master: strings.Contains(flags, ",master,"),
			Myself: strings.Contains(flags, ",myself,"),
			Failed: strings.Contains(flags, ",fail,") || strings.Contains(flags, ",fail?,"),
			Slots:  f[8:]}
		if f[3] != "-" {
			cn.MasterID = f[3]
		}
		out = append(out, cn)
	}
	return out, nil
}

// knownReplicas returns the replicas of a view of the cluster that names
// their master.
func knownReplicas(nodes []ClusterNode) []ClusterNode {
	var out []ClusterNode
	for _, n := range nodes {
		if !n.Master && n.MasterID != "" {
			out = append(out, n)
		}
	}
	return out
}

// node returns the server listening on addr.
func (c *RedisCluster) node(addr string) *Redis {
	for _, n := range c.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// Masters returns the servers that are masters serving slots, as CLUSTER
// NODES reports them now.
func (c *RedisCluster) Masters() ([]*Redis, error) {
	nodes, err := c.ClusterNodes()
	if err != nil {
		return nil, err
	}
	var out []*Redis
	for _, n := range nodes {
		if n.Master && !n.Failed && len(n.Slots) > 0 {
			if r := c.node(n.Addr); r != nil {
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// ReplicaOf returns the replica of master.
func (c *RedisCluster) ReplicaOf(master *Redis) (*Redis, error) {
	nodes, err := c.ClusterNodes()
	if err != nil {
		return nil, err
	}
	id := ""
	for _, n := range nodes {
		if n.Addr == master.Addr {
			id = n.ID
		}
	}
	for _, n := range nodes {
		if id != "" && n.MasterID == id {
			if r := c.node(n.Addr); r != nil {
				return r, nil
			}
		}
	}
	return nil, fmt.Errorf("testserver: %s has no replica in CLUSTER NODES", master.Addr)
}

// manualFailoverTimeout is how long a Redis replica lets a manual failover
// (CLUSTER FAILOVER) take before it aborts it and stays a replica
// (CLUSTER_MF_TIMEOUT in Redis' cluster code).
const manualFailoverTimeout = 5 * time.Second

// Failover sends CLUSTER FAILOVER to replica (a manual failover: the
// replica waits until it has its master's whole replication stream, then
// takes over) and waits up to timeout until it is a master and every
// running node reports cluster_state:ok. Redis aborts a manual failover
// that has not finished within 5 seconds (a master too busy to answer in
// time, on a loaded machine); Failover then sends CLUSTER FAILOVER again,
// until timeout.
//
// It also waits until the old master reports role:slave.
func (c *RedisCluster) Failover(replica *Redis, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	// The replica's own view names its master: another node's may not know
	// yet that it is a replica.
	nodes, err := clusterNodesOf(replica.Addr)
	if err != nil {
		return fmt.Errorf("testserver: CLUSTER NODES of %s: %w", replica.Addr, err)
	}
	var old *Redis
	for _, n := range nodes {
		if n.Myself && n.MasterID != "" {
			for _, m := range nodes {
				if m.ID == n.MasterID {
					old = c.node(m.Addr)
				}
			}
		}
	}
	if old == nil {
		return fmt.Errorf("testserver: %s is not a replica of a known master", replica.Addr)
	}
	for attempt := 1; ; attempt++ {
		_, sendErr := redisDo(replica.Addr, 5*time.Second, "CLUSTER", "FAILOVER")
		// Wait out this attempt: Redis' own limit, a second of slack.
		err := replica.WaitRole("master", min(manualFailoverTimeout+time.Second, time.Until(deadline)))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			if sendErr != nil {
				err = fmt.Errorf("%w (the last CLUSTER FAILOVER: %v)", err, sendErr)
			}
			return fmt.Errorf("testserver: manual failover of %s, %d attempts: %w", replica.Addr, attempt, err)
		}
	}
	if err := c.WaitPromoted(replica, time.Until(deadline)); err != nil {
		return err
	}
	return old.WaitRole("slave", time.Until(deadline))
}

// KillAndPromote fails master over to replica by force: it kills master
// (whose replication to replica CutReplication may have cut: the link is
// healed), waits up to timeout until the cluster has promoted replica,
// then restarts master, which keeps its nodes.conf, learns that its slots
// moved and rejoins as replica's replica (waited for up to timeout too).
func (c *RedisCluster) KillAndPromote(master, replica *Redis, timeout time.Duration) error {
	if err := master.Kill(); err != nil {
		return err
	}
	if err := HealReplication(replica); err != nil {
		return err
	}
	if err := c.WaitPromoted(replica, timeout); err != nil {
		return err
	}
	if err := master.Start(); err != nil {
		return err
	}
	return master.WaitReplicaOf(replica, timeout)
}

// WaitPromoted waits up to timeout until replica has role:master and every
// running node reports cluster_state:ok (after a manual failover, or after
// its master was killed and the cluster failed it over).
func (c *RedisCluster) WaitPromoted(replica *Redis, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	if err := replica.WaitRole("master", timeout); err != nil {
		return err
	}
	return waitUntil(time.Until(deadline), "every running cluster node to report cluster_state:ok", func() error {
		for _, n := range c.Nodes {
			if !n.running() {
				continue
			}
			v, err := redisDo(n.Addr, time.Second, "CLUSTER", "INFO")
			if err != nil {
				return fmt.Errorf("%s: CLUSTER INFO: %w", n.Addr, err)
			}
			info, _ := v.(string)
			if s := redisInfoField(info, "cluster_state"); s != "ok" {
				return fmt.Errorf("%s: cluster_state:%s", n.Addr, s)
			}
		}
		return nil
	})
}
