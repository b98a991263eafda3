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

// motoLauncher serves moto's WSGI app (the one moto_server serves) on
// 127.0.0.1 with one request at a time. moto_server itself runs Werkzeug
// with threaded=True, and moto takes no lock around a conditional write:
// two concurrent conditional PutItems of one key can both succeed (seen
// here: two of 100 claims taking over one expired record both acquired
// it), which DynamoDB never allows. Serving requests one by one gives the
// per-item atomicity DynamoDB guarantees. HTTP/1.0, one connection per
// request; a listen queue deep enough for the suite's 200 contenders.
const motoLauncher = `
import sys
from werkzeug.serving import BaseWSGIServer, make_server
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
BaseWSGIServer.request_queue_size = 1024
server = make_server(sys.argv[1], int(sys.argv[2]), DomainDispatcherApplication(create_backend_app), threaded=False)
print("moto listening on %s:%s, one request at a time" % (sys.argv[1], sys.argv[2]), flush=True)
server.serve_forever()
`

// motoStartTimeout bounds how long moto_server may take to answer: a Python
// server importing moto and its dependencies, on a busy 2-core machine.
const motoStartTimeout = 90 * time.Second

// Moto is a child process serving Python moto's server app (what
// moto_server runs: a second implementation of the AWS APIs beside dynalite
// and fauxqs), listening on 127.0.0.1 only and keeping its data in memory.
type Moto struct {
	// Endpoint is the base URL, "http://127.0.0.1:port", to use as the AWS
	// SDK's endpoint (any region and credentials are accepted).
	Endpoint string

	proc *process
	dir  string
	once sync.Once
}

// StartMoto starts moto's server (the app moto_server runs, served one
// request at a time: see motoLauncher) with python3 on a free 127.0.0.1
// port and returns once it answers HTTP, or fails after 90 seconds with its
// output. When moto_server is not installed it returns ErrMotoMissing.
// Call Close when done; the child is also killed when the test binary
// exits (see the package doc).
func StartMoto() (*Moto, error) {
	if _, err := exec.LookPath("moto_server"); err != nil {
		return nil, ErrMotoMissing
	}
	python, err := exec.LookPath("python3")
	if err != nil {
		return nil, fmt.Errorf("testserver: moto_server is installed but python3 is not on PATH: %s", motoFix)
	}
	dir, err := os.MkdirTemp("", "testserver-moto-*")
	if err != nil {
		return nil, err
	}
	var m *Moto
	err = withFreshPorts(1, func(ports []int) error {
		endpoint := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
		p, err := launch(launchSpec{
			name: "moto " + endpoint,
			path: python,
			args: []string{"-c", motoLauncher, "127.0.0.1", strconv.Itoa(ports[0])},
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
