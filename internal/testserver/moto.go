package testserver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"
)

// ErrMotoMissing: moto_server is not on PATH. Tests that run a second
// implementation of an AWS API on moto skip with this error's text, which
// says how to install it; the required emulators (dynalite, fauxqs) never
// skip.
var ErrMotoMissing = errors.New("testserver: moto_server not found on PATH: " + motoFix)

const motoFix = "install Python moto 5.2.1 with its server (`python3 -m pip install 'moto[server]==5.2.1'`); " +
	"Debian has no package of it, and `make test` cannot fetch it where PyPI is unreachable, so this run is skipped " +
	"(dynalite remains the required DynamoDB emulator)"

// motoStartTimeout bounds how long moto_server may take to answer: a Python
// server importing moto and its dependencies, on a busy 2-core machine.
const motoStartTimeout = 90 * time.Second

// Moto is a moto_server child process (Python moto's standalone server, a
// second implementation of the AWS APIs beside dynalite and fauxqs),
// listening on 127.0.0.1 only and keeping its data in memory.
type Moto struct {
	// Endpoint is the base URL, "http://127.0.0.1:port", to use as the AWS
	// SDK's endpoint (any region and credentials are accepted).
	Endpoint string

	proc *process
	dir  string
	once sync.Once
}

// StartMoto starts moto_server on a free 127.0.0.1 port and returns once it
// answers HTTP, or fails after 90 seconds with its output. When
// moto_server is not installed it returns an error wrapping ErrMotoMissing.
// Call Close when done; the child is also killed when the test binary
// exits (see the package doc).
func StartMoto() (*Moto, error) {
	bin, err := exec.LookPath("moto_server")
	if err != nil {
		return nil, ErrMotoMissing
	}
	dir, err := os.MkdirTemp("", "testserver-moto-*")
	if err != nil {
		return nil, err
	}
	var m *Moto
	err = withFreshPorts(1, func(ports []int) error {
		endpoint := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
		p, err := launch(launchSpec{
			name: "moto_server " + endpoint,
			path: bin,
			args: []string{"-H", "127.0.0.1", "-p", strconv.Itoa(ports[0])},
			dir:  dir,
		})
		if err != nil {
			return err
		}
		if err := p.waitReady(motoStartTimeout, func() error { return httpCheck(endpoint) }); err != nil {
			_ = p.kill()
			return err
		}
		m = &Moto{Endpoint: endpoint, proc: p, dir: dir}
		return nil
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return m, nil
}

// Output returns the last lines moto_server printed.
func (m *Moto) Output() string { return m.proc.out.Tail(8192) }

// Close kills moto_server, waits for it and removes its directory. It may
// be called more than once.
func (m *Moto) Close() error {
	var err error
	m.once.Do(func() {
		_ = m.proc.kill()
		err = os.RemoveAll(m.dir)
	})
	return err
}
