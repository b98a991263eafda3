package testserver

import (
	"syscall"
	"testing"
	"time"
)

// replicatedCluster starts a 3-master cluster with a replica each (node
// timeout nodeTimeout), closed after the test, and returns it with its
// first master and that master's replica.
func replicatedCluster(t *testing.T, nodeTimeout time.Duration) (c *RedisCluster, master, replica *Redis) {
	t.Helper()
	c, err := StartRedisClusterWithReplicas(3, nodeTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	masters, err := c.Masters()
	if err != nil || len(masters) != 3 {
		t.Fatalf("Masters() = %v, %v; want 3", masters, err)
	}
	if replica, err = c.ReplicaOf(masters[0]); err != nil {
		t.Fatal(err)
	}
	// Every node knows every replica once the cluster is returned, so that
	// a test may ask any node (Failover asks the replica, its master may be
	// stopped).
	for _, n := range c.Nodes {
		nodes, err := clusterNodesOf(n.Addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(knownReplicas(nodes)); got != 3 {
			t.Fatalf("%s lists %d replicas with their master, want 3", n.Addr, got)
		}
	}
	return c, masters[0], replica
}

// A cluster with a replica per master fails over by hand.
func TestRedisClusterWithReplicasFailover(t *testing.T) {
	c, master, replica := replicatedCluster(t, time.Second)
	if err := c.Failover(replica, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if role, err := master.Role(); err != nil || role != "slave" {
		t.Fatalf("old master Role() after CLUSTER FAILOVER = %q, %v; want slave", role, err)
	}
}

// A manual failover that Redis aborts (its master stopped for longer than
// the 5 s Redis gives a manual failover, but not long enough for the
// cluster, with a 30 s node timeout, to fail it over by itself) is sent
// again: Failover returns once the replica has taken over, as it would
// on a machine so loaded that the master answered too late.
func TestFailoverRetriesAnAbortedManualFailover(t *testing.T) {
	t.Parallel()
	c, master, replica := replicatedCluster(t, 30*time.Second)
	pid := master.proc.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resume := func() { _ = syscall.Kill(pid, syscall.SIGCONT) }
	defer resume()
	// The first manual failover is aborted while the master sleeps.
	resumed := time.AfterFunc(manualFailoverTimeout+time.Second/2, resume)
	defer resumed.Stop()
	if err := c.Failover(replica, time.Minute); err != nil {
		t.Fatal(err)
	}
	if role, err := master.Role(); err != nil || role != "slave" {
		t.Fatalf("old master Role() after the failover = %q, %v; want slave", role, err)
	}
}
