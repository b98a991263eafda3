package testserver

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const rabbitFix = "run `make test`, which installs it, or `apt-get install -y rabbitmq-server` (Debian's RabbitMQ 3.10 and its Erlang)"

// RabbitReadyTimeout bounds the wait for a RabbitMQ node to accept AMQP
// connections. A fresh node boots in about 4 s on an idle 2-core machine;
// beside the rest of the suite (3 packages at once) and two CPU-bound
// processes, one took more than 30 s. Past this the start fails and says
// so.
const RabbitReadyTimeout = 90 * time.Second

// RabbitMQ is a RabbitMQ node (the Debian rabbitmq-server package) run by
// this process: its own node name, its own Erlang port mapper (epmd) and
// cookie, its database and logs in a temporary directory, listening on
// 127.0.0.1 only.
type RabbitMQ struct {
	// URL is the AMQP URL, "amqp://guest:guest@127.0.0.1:port/" (RabbitMQ
	// lets guest log in from loopback).
	URL string
	// NodeName is the node's Erlang name, unique per start.
	NodeName string
	// Startup is how long the node took to accept AMQP connections.
	Startup time.Duration

	node *process
	epmd *process
	dir  string
	once sync.Once
}

// rabbitServer finds the rabbitmq-server script that runs the node as the
// calling user: Debian's /usr/sbin/rabbitmq-server is a wrapper that
// switches to the rabbitmq user.
func rabbitServer() (string, error) {
	const direct = "/usr/lib/rabbitmq/bin/rabbitmq-server"
	if _, err := os.Stat(direct); err == nil {
		return direct, nil
	}
	return lookPath("rabbitmq-server", rabbitFix)
}

// StartRabbitMQ starts a RabbitMQ node on free 127.0.0.1 ports (AMQP,
// Erlang distribution and epmd) and returns once it answers the AMQP
// protocol header, or an error after RabbitReadyTimeout that says so, with
// the tail of the node's output. It never uses or touches a RabbitMQ or
// epmd that is already running. Call Close to stop it and remove its
// directory.
func StartRabbitMQ() (*RabbitMQ, error) {
	server, err := rabbitServer()
	if err != nil {
		return nil, err
	}
	epmdBin, err := lookPath("epmd", rabbitFix)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "testserver-rabbitmq-*")
	if err != nil {
		return nil, err
	}
	var r *RabbitMQ
	err = withFreshPorts(3, func(ports []int) error {
		r, err = startRabbit(server, epmdBin, dir, ports[0], ports[1], ports[2])
		return err
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return r, nil
}

func startRabbit(server, epmdBin, dir string, amqpPort, distPort, epmdPort int) (*RabbitMQ, error) {
	// Our own epmd, in the foreground, so that the node registers with it
	// (and does not start a daemon that would outlive the test).
	epmd, err := launch(launchSpec{name: "epmd :" + strconv.Itoa(epmdPort), path: epmdBin,
		args: []string{"-port", strconv.Itoa(epmdPort), "-address", "127.0.0.1"}, dir: dir})
	if err != nil {
		return nil, err
	}
	if err := epmd.waitReady(10*time.Second, func() error { return dialCheck("127.0.0.1:" + strconv.Itoa(epmdPort)) }); err != nil {
		_ = epmd.kill()
		return nil, err
	}
	run := filepath.Join(dir, strconv.Itoa(amqpPort))
	if err := os.MkdirAll(run, 0o755); err != nil {
		_ = epmd.kill()
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(run, "enabled_plugins"), []byte("[].\n"), 0o644); err != nil {
		_ = epmd.kill()
		return nil, err
	}
	nodeName := fmt.Sprintf("testserver-%d@localhost", amqpPort)
	env := []string{
		"HOME=" + run, // the Erlang cookie is created here, not in the user's home
		"RABBITMQ_NODENAME=" + nodeName,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT=" + strconv.Itoa(amqpPort),
		"RABBITMQ_DIST_PORT=" + strconv.Itoa(distPort),
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(run, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(run, "log"),
		"RABBITMQ_PID_FILE=" + filepath.Join(run, "pid"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(run, "enabled_plugins"),
		// Files that do not exist: no system configuration is read.
		"RABBITMQ_CONFIG_FILE=" + filepath.Join(run, "rabbitmq"),
		"RABBITMQ_ADVANCED_CONFIG_FILE=" + filepath.Join(run, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE=" + filepath.Join(run, "rabbitmq-env.conf"),
		"ERL_EPMD_PORT=" + strconv.Itoa(epmdPort),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
	}
	start := time.Now()
	node, err := launch(launchSpec{name: "rabbitmq-server " + nodeName, path: server, env: env, dir: run})
	if err != nil {
		_ = epmd.kill()
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(amqpPort)
	if err := node.waitReady(RabbitReadyTimeout, func() error { return amqpCheck(addr) }); err != nil {
		_ = node.kill()
		_ = epmd.kill()
		if errors.Is(err, errAddrInUse) || strings.Contains(node.out.Tail(8192), "eaddrinuse") {
			return nil, fmt.Errorf("testserver: rabbitmq: %w", errAddrInUse)
		}
		return nil, fmt.Errorf("testserver: RabbitMQ did not accept AMQP connections within %v: %w", RabbitReadyTimeout, err)
	}
	return &RabbitMQ{
		URL:      "amqp://guest:guest@" + addr + "/",
		NodeName: nodeName,
		Startup:  time.Since(start),
		node:     node, epmd: epmd, dir: run,
	}, nil
}

// amqpCheck sends the AMQP 0-9-1 protocol header and expects the server's
// first frame, a method frame (type 1: Connection.Start).
func amqpCheck(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("AMQP\x00\x00\x09\x01")); err != nil {
		return err
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return err
	}
	if b[0] != 1 {
		return fmt.Errorf("first frame of type %d, want 1 (method)", b[0])
	}
	return nil
}

// Output returns the last lines the node printed.
func (r *RabbitMQ) Output() string { return r.node.out.Tail(8192) }

// Close stops the node (SIGTERM, then SIGKILL to its process group after
// 15 s), stops its epmd and removes its directory. It may be called more
// than once.
func (r *RabbitMQ) Close() error {
	var err error
	r.once.Do(func() {
		_ = r.node.stop(syscall.SIGTERM, 15*time.Second)
		_ = r.epmd.kill()
		err = os.RemoveAll(filepath.Dir(r.dir))
	})
	return err
}
