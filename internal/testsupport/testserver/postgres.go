package testserver

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const postgresFix = "run `make test`, which installs it, or `apt-get install -y postgresql`"

// sharedPostgresAddr is where a machine-wide PostgreSQL server may already run.
const sharedPostgresAddr = "127.0.0.1:5432"

// Postgres is a PostgreSQL server reachable over TCP on 127.0.0.1 with trust
// authentication.
type Postgres struct {
	// DSN is a URL such as
	// "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable".
	DSN string
	// Shared is true when DSN points at a server that someone else runs
	// (the one on 127.0.0.1:5432): tests must only use databases or schemas
	// they create themselves, and must not stop it. Close leaves it alone.
	Shared bool

	mu   sync.Mutex
	proc *process
	dir  string
}

// StartPostgres returns a PostgreSQL server for tests.
//
// If a server on 127.0.0.1:5432 completes a trust login as user postgres
// (or else as the current OS user) into database postgres, it is reused
// (Shared is true). Otherwise a throwaway cluster is created with initdb in
// a temporary directory and started on a free 127.0.0.1 port, with fsync off
// and trust authentication for user postgres; when the test binary runs as
// root, initdb and postgres run as the OS user postgres (created by the
// Debian package), since PostgreSQL refuses to run as root. Call Close when
// done.
func StartPostgres() (*Postgres, error) {
	if dialCheck(sharedPostgresAddr) == nil {
		users := []string{"postgres"}
		if u, err := user.Current(); err == nil && u.Username != "postgres" {
			users = append(users, u.Username)
		}
		for _, u := range users {
			if pgProbe(sharedPostgresAddr, u, "postgres") == nil {
				return &Postgres{DSN: pgDSN(u, sharedPostgresAddr), Shared: true}, nil
			}
		}
	}
	return startOwnPostgres()
}

func pgDSN(user, addr string) string {
	return fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable", user, addr)
}

// postgresBinaries finds initdb and postgres: on PATH, else in the newest
// /usr/lib/postgresql/<version>/bin (Debian does not put them on PATH).
func postgresBinaries() (initdb, postgres string, err error) {
	if i, err1 := exec.LookPath("initdb"); err1 == nil {
		if p, err2 := exec.LookPath("postgres"); err2 == nil {
			return i, p, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(a, b int) bool { return pgDirVersion(dirs[a]) > pgDirVersion(dirs[b]) })
	for _, d := range dirs {
		i, p := filepath.Join(d, "initdb"), filepath.Join(d, "postgres")
		if isExecutable(i) && isExecutable(p) {
			return i, p, nil
		}
	}
	return "", "", fmt.Errorf("testserver: no PostgreSQL server on %s accepts a trust login, and no initdb/postgres "+
		"binaries were found on PATH or in /usr/lib/postgresql/*/bin: %s", sharedPostgresAddr, postgresFix)
}

func pgDirVersion(dir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64)
	return v
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// postgresDir makes a temporary directory for a cluster, and the
// credentials its processes run with: the OS user postgres, its owner,
// when the test runs as root (PostgreSQL refuses to run as root), none
// otherwise.
func postgresDir(pattern string) (string, *syscall.Credential, error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", nil, err
	}
	if os.Geteuid() != 0 {
		return dir, nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("testserver: running as root, PostgreSQL must run as another user, "+
			"but the OS user postgres does not exist (%v): %s", err, postgresFix)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	return dir, &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// startOwnPostgres creates and starts a throwaway cluster on a free port.
func startOwnPostgres() (*Postgres, error) {
	initdb, postgres, err := postgresBinaries()
	if err != nil {
		return nil, err
	}
	dir, cred, err := postgresDir("testserver-postgres-*")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Postgres, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	data := filepath.Join(dir, "data")
	cmd := exec.Command(initdb, "-D", data, "-U", "postgres", "--auth=trust",
		"--encoding=UTF8", "--locale=C", "--no-sync")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	if out, err := runCmd(cmd, 2*time.Minute); err != nil {
		return fail(fmt.Errorf("testserver: initdb: %v; its output:\n%s", err, tailOf(out, 4096)))
	}
	var pg *Postgres
	err = withFreshPorts(1, func(ports []int) error {
		addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
		p, err := launch(launchSpec{
			name: "postgres " + addr,
			path: postgres,
			args: []string{"-D", data, "-p", strconv.Itoa(ports[0]),
				"-c", "listen_addresses=127.0.0.1",
				"-c", "unix_socket_directories=" + dir,
				"-c", "fsync=off",
				"-c", "synchronous_commit=off",
				"-c", "full_page_writes=off",
			},
			env:  []string{"LC_ALL=C"},
			dir:  dir,
			cred: cred,
		})
		if err != nil {
			return err
		}
		if err := p.waitReady(60*time.Second, func() error { return pgProbe(addr, "postgres", "postgres") }); err != nil {
			_ = p.kill()
			return err
		}
		pg = &Postgres{DSN: pgDSN("postgres", addr), proc: p, dir: dir}
		return nil
	})
	if err != nil {
		return fail(err)
	}
	return pg, nil
}

func tailOf(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimRight(string(b), "\n")
}

// Close stops the server if this package started it (fast shutdown, then
// SIGKILL to its process group after 10 s) and removes its directory. A
// Shared server is left running. Close may be called more than once.
func (p *Postgres) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc == nil {
		return nil
	}
	_ = p.proc.stop(syscall.SIGINT, 10*time.Second)
	p.proc = nil
	return os.RemoveAll(p.dir)
}

// pgProbe performs a PostgreSQL startup handshake as user into database and
// returns nil once the server says ReadyForQuery without asking for a
// password.
func pgProbe(addr, user, database string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))

	var body []byte
	body = binary.BigEndian.AppendUint32(body, 196608) // protocol 3.0
	for _, s := range []string{"user", user, "database", database} {
		body = append(append(body, s...), 0)
	}
	body = append(body, 0)
	msg := binary.BigEndian.AppendUint32(nil, uint32(len(body)+4))
	if _, err := c.Write(append(msg, body...)); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return err
		}
		n := int(binary.BigEndian.Uint32(hdr[1:])) - 4
		if n < 0 || n > 1<<20 {
			return errors.New("postgres: bad message length")
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil {
			return err
		}
		switch hdr[0] {
		case 'R':
			if n < 4 {
				return errors.New("postgres: short authentication message")
			}
			if code := binary.BigEndian.Uint32(payload); code != 0 {
				return fmt.Errorf("postgres: server wants authentication method %d for user %s, not trust", code, user)
			}
		case 'E':
			return fmt.Errorf("postgres: %s", pgErrorMessage(payload))
		case 'Z':
			_, _ = c.Write([]byte{'X', 0, 0, 0, 4}) // Terminate
			return nil
		}
	}
}

func pgErrorMessage(payload []byte) string {
	var parts []string
	for _, f := range strings.Split(string(payload), "\x00") {
		if len(f) > 1 && (f[0] == 'M' || f[0] == 'C') {
			parts = append(parts, f[1:])
		}
	}
	return strings.Join(parts, ": ")
}
