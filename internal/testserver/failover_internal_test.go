package testserver

import (
	"syscall"
	"testing"
	"time"
)

// A manual failover that Redis aborts (its master stopped for longer than
// the 5 s Redis gives a manual failover, but not long enough for the
// cluster, with a 30 s node timeout, to fail it over by itself) is sent
// again: Failover returns once the replica has taken over, as it would
// on a machine so loaded that the master answered too late.
func TestFailoverRetriesAnAbortedManualFailover(t *testing.T) {
	t.Parallel()
	c, err := StartRedisClusterWithReplicas(3, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	masters, err := c.Masters()
	if err != nil || len(masters) != 3 {
		t.Fatalf("Masters() = %v, %v; want 3", masters, err)
	}
	replica, err := c.ReplicaOf(masters[0])
	if err != nil {
		t.Fatal(err)
	}
	pid := masters[0].proc.cmd.Process.Pid
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
	if role, err := masters[0].Role(); err != nil || role != "slave" {
		t.Fatalf("old master Role() after the failover = %q, %v; want slave", role, err)
	}
}
