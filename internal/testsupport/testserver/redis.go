package testserver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const redisFix = "run `make test`, which installs it, or `apt-get install -y redis-server`"

// minRedisMajor is the oldest redis-server major version supported (7.0
// brought cluster-port, ADDSLOTSRANGE and the functions the suite relies on).
const minRedisMajor = 7

var redisBinary = sync.OnceValues(func() (string, error) {
	path, err := lookPath("redis-server", redisFix)
	if err != nil {
		return "", err
	}
	out, err := exec.Command(path, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("testserver: %s --version: %v: %s", path, err, out)
	}
	m := regexp.MustCompile(`v=(\d+)\.(\d+)\.(\d+)`).FindStringSubmatch(string(out))
	if m == nil {
		return "", fmt.Errorf("testserver: cannot read the version of %s from %q", path, out)
	}
	if major, _ := strconv.Atoi(m[1]); major < minRedisMajor {
		return "", fmt.Errorf("testserver: %s is version %s.%s.%s, but 7.0 or newer is needed: "+
			"install a newer redis-server (Debian 12 and later ship 7.x: `apt-get install -y redis-server`)",
			path, m[1], m[2], m[3])
	}
	return path, nil
})

// Redis is a redis-server child process listening on 127.0.0.1, without
// persistence (--save "" --appendonly no) and with its own temporary --dir.
//
// It can be killed and started again on the same port (Kill, Stop, Start,
// Restart), for tests of what clients do while the server is down. All
// methods are safe for concurrent use.
type Redis struct {
	// Addr is "127.0.0.1:port"; it stays the same across restarts.
	Addr string

	port      int
	busPort   int // cluster bus port, 0 outside a cluster
	dir       string
	extraArgs []string

	mu     sync.Mutex
	proc   *process
	closed bool
}

// StartRedis starts a redis-server (7.0 or newer) on a free 127.0.0.1 port
// and returns once it answers PING. Call Close when done.
func StartRedis() (*Redis, error) {
	return startRedis("redis", nil, 1)
}

// StartRedisWithArgs is StartRedis with extra redis-server arguments after
// the defaults, kept across restarts: for example "--maxmemory-policy",
// "allkeys-lru", or "--rename-command", "CONFIG", "" (a server without
// CONFIG, as managed Redis services run).
func StartRedisWithArgs(args ...string) (*Redis, error) {
	return startRedis("redis", func(string, []int) []string { return args }, 1)
}

// startRedis starts one redis-server on nPorts free ports (the first for
// clients, a second for the cluster bus), with extra arguments from extra.
func startRedis(prefix string, extra func(dir string, ports []int) []string, nPorts int) (*Redis, error) {
	if _, err := redisBinary(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "testserver-"+prefix+"-*")
	if err != nil {
		return nil, err
	}
	var r *Redis
	err = withFreshPorts(nPorts, func(ports []int) error {
		r = &Redis{Addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), port: ports[0], dir: dir}
		if len(ports) > 1 {
			r.busPort = ports[1]
		}
		if extra != nil {
			r.extraArgs = extra(dir, ports)
		}
		return r.startOnce()
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return r, nil
}

// startOnce launches the process and waits for PING; r.mu must be held or r
// not yet shared.
func (r *Redis) startOnce() error {
	bin, err := redisBinary()
	if err != nil {
		return err
	}
	args := []string{
		"--port", strconv.Itoa(r.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", r.dir,
		"--daemonize", "no",
		"--logfile", "",
		"--databases", "16",
	}
	args = append(args, r.extraArgs...)
	p, err := launch(launchSpec{name: "redis-server " + r.Addr, path: bin, args: args, dir: r.dir})
	if err != nil {
		return err
	}
	if err := p.waitReady(10*time.Second, func() error { return pingRedis(r.Addr) }); err != nil {
		_ = p.kill()
		return err
	}
	r.proc = p
	return nil
}

// Start starts the server again on the same port after Kill or Stop. It
// retries for a few seconds while the port is still taken. It does nothing
// if the server is running.
func (r *Redis) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("testserver: Start on a closed Redis")
	}
	if r.proc != nil && !r.proc.exited() {
		return nil
	}
	var err error
	for i := 0; i < 50; i++ { // up to ~5 s of TIME_WAIT or a slow previous exit
		if err = r.startOnce(); !errors.Is(err, errAddrInUse) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// Kill kills the server abruptly (SIGKILL, like a crash) and waits for it to
// exit. The port and directory are kept for Start.
func (r *Redis) Kill() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		_ = r.proc.kill()
	}
	return nil
}

// Stop shuts the server down cleanly (SIGTERM; SIGKILL after 5 s) and waits
// for it to exit. The port and directory are kept for Start.
func (r *Redis) Stop() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		_ = r.proc.stop(syscall.SIGTERM, 5*time.Second)
	}
	return nil
}

// Restart is Kill followed by Start: the same port, an empty data set
// (nothing is persisted), except that a cluster node keeps its nodes.conf.
func (r *Redis) Restart() error {
	if err := r.Kill(); err != nil {
		return err
	}
	return r.Start()
}

// Close kills the server and removes its directory. It may be called more
// than once.
func (r *Redis) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	if r.proc != nil {
		_ = r.proc.kill()
	}
	return os.RemoveAll(r.dir)
}

// Output returns the last lines the server printed (it logs to stdout).
func (r *Redis) Output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return ""
	}
	return r.proc.out.Tail(8192)
}

// RedisCluster is a Redis Cluster of masters only (no replicas), each node a
// redis-server on 127.0.0.1 with its own free client and cluster-bus ports.
type RedisCluster struct {
	// Addrs holds "127.0.0.1:port" of every master, in slot order.
	Addrs []string
	// Nodes are the servers behind Addrs. A node can be killed and started
	// again (Redis.Restart): it keeps its nodes.conf, so it rejoins.
	Nodes []*Redis
}

// StartRedisCluster starts masters redis-server nodes in cluster mode
// (--cluster-node-timeout 2000), joins them with `redis-cli --cluster
// create ... --cluster-replicas 0` (or, for fewer than 3 masters, which
// redis-cli refuses, with CLUSTER ADDSLOTSRANGE and CLUSTER MEET), and
// returns once every node reports cluster_state:ok. Call Close when done.
func StartRedisCluster(masters int) (*RedisCluster, error) {
	if masters < 1 {
		return nil, fmt.Errorf("testserver: StartRedisCluster(%d): need at least one master", masters)
	}
	cli := ""
	if masters >= 3 {
		var err error
		if cli, err = lookPath("redis-cli", redisFix); err != nil {
			return nil, err
		}
	}
	c := &RedisCluster{}
	for i := 0; i < masters; i++ {
		n, err := startRedis("redis-cluster", func(dir string, ports []int) []string {
			return []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", fmt.Sprintf("%s/nodes-%d.conf", dir, ports[0]),
				"--cluster-node-timeout", "2000",
				"--cluster-port", strconv.Itoa(ports[1]),
			}
		}, 2)
		if err != nil {
			_ = c.Close()
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
		c.Addrs = append(c.Addrs, n.Addr)
	}
	var err error
	if cli != "" {
		args := append([]string{"--cluster", "create"}, c.Addrs...)
		args = append(args, "--cluster-replicas", "0", "--cluster-yes")
		var out []byte
		if out, err = runCmd(exec.Command(cli, args...), time.Minute); err != nil {
			err = fmt.Errorf("testserver: redis-cli --cluster create: %v; its output:\n%s", err, out)
		}
	} else {
		err = c.joinSmall()
	}
	if err == nil {
		err = c.waitOK(30 * time.Second)
	}
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// joinSmall assigns slots evenly and meets the nodes: what redis-cli does,
// for the 1 or 2 masters it will not handle.
func (c *RedisCluster) joinSmall() error {
	n := len(c.Nodes)
	for i, node := range c.Nodes {
		lo, hi := i*16384/n, (i+1)*16384/n-1
		if _, err := redisDo(node.Addr, 5*time.Second, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi)); err != nil {
			return fmt.Errorf("testserver: CLUSTER ADDSLOTSRANGE on %s: %w", node.Addr, err)
		}
		if _, err := redisDo(node.Addr, 5*time.Second, "CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i+1)); err != nil {
			return fmt.Errorf("testserver: CLUSTER SET-CONFIG-EPOCH on %s: %w", node.Addr, err)
		}
	}
	first := c.Nodes[0]
	bus := strconv.Itoa(first.busPort)
	for _, node := range c.Nodes[1:] {
		if _, err := redisDo(node.Addr, 5*time.Second, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(first.port), bus); err != nil {
			return fmt.Errorf("testserver: CLUSTER MEET from %s: %w", node.Addr, err)
		}
	}
	return nil
}

// waitOK waits until every node reports cluster_state:ok, knows every other
// node, and sees all 16384 slots served.
func (c *RedisCluster) waitOK(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	want := strconv.Itoa(len(c.Nodes))
	for {
		var bad error
		for _, n := range c.Nodes {
			v, err := redisDo(n.Addr, time.Second, "CLUSTER", "INFO")
			if err != nil {
				bad = fmt.Errorf("%s: CLUSTER INFO: %w", n.Addr, err)
				break
			}
			info, _ := v.(string)
			if redisInfoField(info, "cluster_state") != "ok" ||
				redisInfoField(info, "cluster_known_nodes") != want ||
				redisInfoField(info, "cluster_slots_ok") != "16384" {
				bad = fmt.Errorf("%s: CLUSTER INFO says %s", n.Addr, strings.Join(strings.Fields(info), " "))
				break
			}
		}
		if bad == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testserver: redis cluster not ok after %v: %v", timeout, bad)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitOK waits up to timeout until every node reports cluster_state:ok
// again, for example after a node was restarted.
func (c *RedisCluster) WaitOK(timeout time.Duration) error { return c.waitOK(timeout) }

// Close kills every node and removes their directories. It may be called
// more than once.
func (c *RedisCluster) Close() error {
	var errs []error
	for _, n := range c.Nodes {
		errs = append(errs, n.Close())
	}
	return errors.Join(errs...)
}
