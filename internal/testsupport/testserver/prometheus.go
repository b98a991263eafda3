package testserver

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Prometheus is a Prometheus server started by StartPrometheus.
type Prometheus struct {
	// URL is the server's base URL, http://127.0.0.1:<port>.
	URL string

	proc *process
	dir  string
	once sync.Once
}

// prometheusHint says how to get the server.
const prometheusHint = "install Debian's prometheus package (apt-get install prometheus; bash scripts/ensure-test-deps.sh does it), which ships the server and promtool"

// StartPrometheus starts a prometheus server (Debian's package) on a free
// 127.0.0.1 port with the configuration config (the text of a
// prometheus.yml; rule files must be named by absolute paths) and its
// database in a temporary directory, and returns once the server reports
// itself ready (/-/ready). Never the service the package may have set up:
// a server of its own. Call Close when done.
func StartPrometheus(config string) (*Prometheus, error) {
	bin, err := lookPath("prometheus", prometheusHint)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "testserver-prometheus-*")
	if err != nil {
		return nil, err
	}
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, []byte(config), 0o644); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	var s *Prometheus
	err = withFreshPorts(1, func(ports []int) error {
		addr := "127.0.0.1:" + strconv.Itoa(ports[0])
		p, err := launch(launchSpec{name: "prometheus " + addr, path: bin, dir: dir, args: []string{
			"--config.file=" + cfgFile,
			"--storage.tsdb.path=" + filepath.Join(dir, "data"),
			"--web.listen-address=" + addr,
			"--log.level=warn",
		}})
		if err != nil {
			return err
		}
		url := "http://" + addr
		if err := p.waitReady(60*time.Second, func() error { return prometheusReady(url) }); err != nil {
			_ = p.kill()
			return err
		}
		s = &Prometheus{URL: url, proc: p, dir: dir}
		return nil
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// prometheusReady returns nil once the server answers /-/ready with 200.
func prometheusReady(url string) error {
	if err := dialCheck(url[len("http://"):]); err != nil {
		return err
	}
	resp, err := probeClient.Get(url + "/-/ready")
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/-/ready answered %s", resp.Status)
	}
	return nil
}

// Output returns the last lines the server logged.
func (p *Prometheus) Output() string { return p.proc.out.Tail(8192) }

// Close stops the server (SIGTERM: it closes its database cleanly; killed
// after 20s if it has not exited), waits for it and removes its directory.
// It may be called more than once.
func (p *Prometheus) Close() error {
	var err error
	p.once.Do(func() {
		_ = p.proc.stop(syscall.SIGTERM, 20*time.Second)
		err = os.RemoveAll(p.dir)
	})
	return err
}
