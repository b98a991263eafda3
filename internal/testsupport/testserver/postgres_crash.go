package testserver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// CrashablePostgres is a throwaway PostgreSQL server of its own (never the
// shared one on 127.0.0.1:5432) that a test may crash and start again on
// the same port and data directory, for tests of what survives a crash.
//
// Unlike StartPostgres's own server it runs with synchronous_commit on
// (PostgreSQL's default): a commit is acknowledged once its WAL is written
// to the operating system, so a crash of the server (not of the machine)
// loses no acknowledged commit. fsync stays off: the tests never crash the
// machine. All methods are safe for concurrent use.
type CrashablePostgres struct {
	// DSN is "postgres://postgres@127.0.0.1:port/postgres?sslmode=disable";
	// it stays the same across restarts.
	DSN string

	postgres, data, dir string
	port                int
	cred                *syscall.Credential

	mu     chan struct{} // a one-slot lock, held by Stop/Start/Close
	proc   *process
	closed bool
}

// StartCrashablePostgres creates a cluster with initdb in a temporary
// directory and starts it on a free 127.0.0.1 port with trust
// authentication for user postgres (as the OS user postgres when the test
// runs as root). Call Close when done.
func StartCrashablePostgres() (*CrashablePostgres, error) {
	initdb, postgres, err := postgresBinaries()
	if err != nil {
		return nil, err
	}
	dir, cred, err := postgresDir("testserver-postgres-crash-*")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*CrashablePostgres, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	p := &CrashablePostgres{postgres: postgres, data: filepath.Join(dir, "data"), dir: dir, cred: cred, mu: make(chan struct{}, 1)}
	cmd := exec.Command(initdb, "-D", p.data, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	if out, err := runCmd(cmd, 2*time.Minute); err != nil {
		return fail(fmt.Errorf("testserver: initdb: %v; its output:\n%s", err, tailOf(out, 4096)))
	}
	err = withFreshPorts(1, func(ports []int) error {
		p.port = ports[0]
		return p.startOnce()
	})
	if err != nil {
		return fail(err)
	}
	p.DSN = pgDSN("postgres", p.addr())
	return p, nil
}

func (p *CrashablePostgres) addr() string { return fmt.Sprintf("127.0.0.1:%d", p.port) }

func (p *CrashablePostgres) lock()   { p.mu <- struct{}{} }
func (p *CrashablePostgres) unlock() { <-p.mu }

// startOnce launches the server and waits until it accepts a login (after
// crash recovery, when it was crashed); p.mu must be held or p not yet
// shared.
func (p *CrashablePostgres) startOnce() error {
	addr := p.addr()
	proc, err := launch(launchSpec{
		name: "postgres " + addr,
		path: p.postgres,
		args: []string{"-D", p.data, "-p", strconv.Itoa(p.port),
			"-c", "listen_addresses=127.0.0.1",
			"-c", "unix_socket_directories=" + p.dir,
			"-c", "fsync=off",
			"-c", "synchronous_commit=on",
			"-c", "full_page_writes=off",
		},
		env:  []string{"LC_ALL=C"},
		dir:  p.dir,
		cred: p.cred,
	})
	if err != nil {
		return err
	}
	if err := proc.waitReady(60*time.Second, func() error { return pgProbe(addr, "postgres", "postgres") }); err != nil {
		_ = proc.kill()
		return err
	}
	p.proc = proc
	return nil
}

// StopImmediate stops the server in PostgreSQL's immediate mode (SIGQUIT
// to the postmaster, as `pg_ctl stop -m immediate`): every backend exits at
// once without a checkpoint, and the next start runs crash recovery. It
// waits until the server has exited (SIGKILL to its process group after
// 10 s).
func (p *CrashablePostgres) StopImmediate() error {
	p.lock()
	defer p.unlock()
	if p.proc != nil {
		_ = p.proc.stop(syscall.SIGQUIT, 10*time.Second)
	}
	return nil
}

// Start starts the server again on the same port and data directory after
// StopImmediate, and returns once it accepts logins. It retries for a few
// seconds while the port is still taken. It does nothing if the server
// runs.
func (p *CrashablePostgres) Start() error {
	p.lock()
	defer p.unlock()
	if p.closed {
		return errors.New("testserver: Start on a closed CrashablePostgres")
	}
	if p.proc != nil && !p.proc.exited() {
		return nil
	}
	var err error
	for i := 0; i < 50; i++ {
		if err = p.startOnce(); !errors.Is(err, errAddrInUse) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// Close kills the server and removes its directory. It may be called more
// than once.
func (p *CrashablePostgres) Close() error {
	p.lock()
	defer p.unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.proc != nil {
		_ = p.proc.kill()
	}
	return os.RemoveAll(p.dir)
}

// Output returns the last lines the server printed.
func (p *CrashablePostgres) Output() string {
	p.lock()
	defer p.unlock()
	if p.proc == nil {
		return ""
	}
	return p.proc.out.Tail(8192)
}
