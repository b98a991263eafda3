package testserver

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// spawner: every child is forked from one goroutine locked to its OS thread
// for the lifetime of the process, so that Pdeathsig (which fires when the
// forking *thread* exits) only fires when the test binary exits.

type spawnRequest struct {
	cmd  *exec.Cmd
	errc chan error
}

var (
	spawnOnce sync.Once
	spawnReqs chan spawnRequest
)

func spawner(reqs <-chan spawnRequest) {
	runtime.LockOSThread() // never unlocked on purpose: see the package doc.
	for r := range reqs {
		r.errc <- r.cmd.Start()
	}
}

// startCmd starts cmd from the spawner thread, in its own process group,
// with Pdeathsig = SIGKILL.
func startCmd(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnReqs = make(chan spawnRequest)
		go spawner(spawnReqs)
	})
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	r := spawnRequest{cmd: cmd, errc: make(chan error, 1)}
	spawnReqs <- r
	return <-r.errc
}

// runCmd runs a short-lived command to completion through the spawner and
// returns its combined output. It is killed after timeout.
func runCmd(cmd *exec.Cmd, timeout time.Duration) ([]byte, error) {
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second
	if err := startCmd(cmd); err != nil {
		return nil, err
	}
	t := time.AfterFunc(timeout, func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	err := cmd.Wait()
	if !t.Stop() && err != nil {
		err = fmt.Errorf("timed out after %v: %w", timeout, err)
	}
	return out.Bytes(), err
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

// Tail returns up to n trailing bytes, starting at a line boundary when possible.
func (b *tailBuffer) Tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.buf
	if len(s) > n {
		s = s[len(s)-n:]
		if i := bytes.IndexByte(s, '\n'); i >= 0 && i < len(s)-1 {
			s = s[i+1:]
		}
	}
	return strings.TrimRight(string(s), "\n")
}

// process is one running server: a child process leading its own group.
type process struct {
	name string
	cmd  *exec.Cmd
	out  *tailBuffer
	done chan struct{} // closed once Wait has returned
	err  error         // Wait's result, valid after done is closed
}

type launchSpec struct {
	name string   // for messages
	path string   // program
	args []string // arguments, without the program
	env  []string // added to os.Environ()
	dir  string   // working directory
	cred *syscall.Credential
}

func launch(s launchSpec) (*process, error) {
	cmd := exec.Command(s.path, s.args...)
	cmd.Env = append(os.Environ(), s.env...)
	cmd.Dir = s.dir
	out := &tailBuffer{max: 64 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 2 * time.Second
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	if err := startCmd(cmd); err != nil {
		return nil, fmt.Errorf("testserver: starting %s: %w", s.name, err)
	}
	p := &process{name: s.name, cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL to the whole process group and waits for the leader.
func (p *process) kill() error {
	if !p.exited() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-p.done
	return nil
}

// stop sends sig to the group leader, waits up to grace for it to exit, then
// kills the whole group.
func (p *process) stop(sig syscall.Signal, grace time.Duration) error {
	if !p.exited() {
		_ = p.cmd.Process.Signal(sig)
		select {
		case <-p.done:
		case <-time.After(grace):
		}
	}
	// Kill stragglers of the group (e.g. PostgreSQL backends) either way.
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	return nil
}

// errAddrInUse marks a start that failed because the port was taken.
var errAddrInUse = errors.New("address already in use")

// waitReady polls probe until it succeeds, the process exits or timeout
// passes. Errors carry the tail of the server's output.
func (p *process) waitReady(timeout time.Duration, probe func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = probe(); last == nil {
			return nil
		}
		select {
		case <-p.done:
			tail := p.out.Tail(4096)
			if strings.Contains(strings.ToLower(tail), "address already in use") {
				return fmt.Errorf("testserver: %s: %w:\n%s", p.name, errAddrInUse, tail)
			}
			return fmt.Errorf("testserver: %s exited before it was ready (%v); its output:\n%s", p.name, p.err, tail)
		case <-time.After(25 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = p.kill()
			return fmt.Errorf("testserver: %s not ready after %v (last check: %v); its output:\n%s",
				p.name, timeout, last, p.out.Tail(4096))
		}
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("testserver: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startAttempts is how many fresh ports a start tries when the port it
// picked is taken before the server binds it.
const startAttempts = 5

// withFreshPorts calls try with n distinct free ports until it does not fail
// with errAddrInUse.
func withFreshPorts(n int, try func(ports []int) error) error {
	var err error
	for attempt := 0; attempt < startAttempts; attempt++ {
		ports := make([]int, 0, n)
		seen := map[int]bool{}
		for len(ports) < n {
			p, perr := freePort()
			if perr != nil {
				return perr
			}
			if !seen[p] {
				seen[p] = true
				ports = append(ports, p)
			}
		}
		if err = try(ports); !errors.Is(err, errAddrInUse) {
			return err
		}
	}
	return err
}

// dialCheck reports whether something accepts TCP connections on addr.
func dialCheck(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return err
	}
	return c.Close()
}

// lookPath finds a program on PATH, or returns an error that says how to
// install it.
func lookPath(prog, fix string) (string, error) {
	p, err := exec.LookPath(prog)
	if err != nil {
		return "", fmt.Errorf("testserver: %s not found on PATH: %s", prog, fix)
	}
	return p, nil
}

// rootModule is the first line of the repository root's go.mod: the
// repository holds several modules, and only the root's go.mod names it.
const rootModule = "module github.com/watermill-dedup/watermill-dedup\n"

// RepoRoot returns the repository's root directory (the one whose go.mod
// declares the root module), walking up from the working directory (the
// package directory under `go test`) past the go.mod of the store, adapter
// and tooling modules.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), rootModule) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testserver: no go.mod of module github.com/watermill-dedup/watermill-dedup above the working directory")
		}
		dir = parent
	}
}
