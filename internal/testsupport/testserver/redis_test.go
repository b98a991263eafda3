package testserver

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestRedisLifecycle(t *testing.T) {
	t.Parallel()
	r := timed(t, "redis", StartRedis)
	t.Cleanup(func() { r.Close() })
	if r.Addr == "127.0.0.1:6379" || !strings.HasPrefix(r.Addr, "127.0.0.1:") {
		t.Fatalf("Addr = %q, want our own 127.0.0.1 port", r.Addr)
	}
	assertLoopbackOnly(t, portOf(t, r.Addr))
	mustDo(t, r.Addr, "SET", "k", "v")
	if v := mustDo(t, r.Addr, "GET", "k"); v != "v" {
		t.Fatalf("GET k = %v", v)
	}

	pid := r.proc.cmd.Process.Pid
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	waitDead(t, pid, time.Second)
	if err := pingRedis(r.Addr); err == nil {
		t.Fatal("PING answered after Kill")
	}
	t0 := time.Now()
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("redis restarted on the same port in %d ms", time.Since(t0).Milliseconds())
	if v := mustDo(t, r.Addr, "GET", "k"); v != nil {
		t.Fatalf("GET k after restart = %v, want nil (no persistence)", v)
	}
	if err := r.Start(); err != nil { // no-op while running
		t.Fatal(err)
	}

	// Restart with clients connected, several times in a row: TIME_WAIT
	// and a dying predecessor must not stop the server binding again.
	for i := 0; i < 3; i++ {
		mustDo(t, r.Addr, "SET", "k", "v")
		if err := r.Restart(); err != nil {
			t.Fatalf("Restart %d: %v", i, err)
		}
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	mustDo(t, r.Addr, "PING")

	pid = r.proc.cmd.Process.Pid
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	waitDead(t, pid, time.Second)
	if _, err := os.Stat(r.dir); !os.IsNotExist(err) {
		t.Fatalf("dir %s still there after Close: %v", r.dir, err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := r.Start(); err == nil {
		t.Fatal("Start after Close succeeded")
	}
}

func TestRedisTwoServersDistinctPorts(t *testing.T) {
	t.Parallel()
	a := timed(t, "redis a", StartRedis)
	defer a.Close()
	b := timed(t, "redis b", StartRedis)
	defer b.Close()
	if a.Addr == b.Addr {
		t.Fatalf("both on %s", a.Addr)
	}
	mustDo(t, a.Addr, "SET", "only-a", "1")
	if v := mustDo(t, b.Addr, "GET", "only-a"); v != nil {
		t.Fatalf("b sees a's key: %v", v)
	}
}

func TestRedisCluster(t *testing.T) {
	t.Parallel()
	c := timed(t, "redis cluster (3 masters)", func() (*RedisCluster, error) { return StartRedisCluster(3) })
	defer c.Close()
	if len(c.Addrs) != 3 {
		t.Fatalf("Addrs = %v", c.Addrs)
	}
	for _, a := range c.Addrs {
		assertLoopbackOnly(t, portOf(t, a))
		info, _ := mustDo(t, a, "CLUSTER", "INFO").(string)
		if redisInfoField(info, "cluster_state") != "ok" || redisInfoField(info, "cluster_size") != "3" {
			t.Fatalf("%s: CLUSTER INFO = %s", a, info)
		}
	}
	// A write lands on exactly one node; the others redirect.
	var moved, ok int
	for _, a := range c.Addrs {
		_, err := redisDo(a, time.Second, "SET", "{tag}k", "v")
		switch {
		case err == nil:
			ok++
		case strings.HasPrefix(err.Error(), "MOVED"):
			moved++
		default:
			t.Fatalf("SET on %s: %v", a, err)
		}
	}
	if ok != 1 || moved != 2 {
		t.Fatalf("SET succeeded on %d nodes, MOVED on %d", ok, moved)
	}

	// A killed node comes back on the same ports with its nodes.conf and
	// the cluster heals.
	n := c.Nodes[1]
	if err := n.Restart(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := c.WaitOK(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster ok again %d ms after a node restart", time.Since(t0).Milliseconds())

	pids := []int{}
	for _, n := range c.Nodes {
		pids = append(pids, n.proc.cmd.Process.Pid)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range pids {
		waitDead(t, p, time.Second)
	}
}

func TestRedisClusterSmall(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2} {
		t0 := time.Now()
		c, err := StartRedisCluster(n)
		if err != nil {
			t.Fatalf("StartRedisCluster(%d): %v", n, err)
		}
		t.Logf("redis cluster (%d masters) started in %d ms", n, time.Since(t0).Milliseconds())
		info, _ := mustDo(t, c.Addrs[0], "CLUSTER", "INFO").(string)
		if redisInfoField(info, "cluster_state") != "ok" {
			t.Fatalf("masters=%d: %s", n, info)
		}
		c.Close()
	}
	if _, err := StartRedisCluster(0); err == nil {
		t.Fatal("StartRedisCluster(0) succeeded")
	}
}

func mustDo(t *testing.T, addr string, args ...string) any {
	t.Helper()
	v, err := redisDo(addr, 2*time.Second, args...)
	if err != nil {
		t.Fatalf("%s %v: %v", addr, args, err)
	}
	return v
}
