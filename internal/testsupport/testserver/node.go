package testserver

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"time"
)

const (
	nodeFix    = "run `make test`, which installs it, or install Node.js 20 or newer (`apt-get install -y nodejs npm` where the distribution's is new enough)"
	npmToolFix = "run `make test`, which installs it, or `npm ci --prefix tools` in the repository root"
)

var nodeBinary = sync.OnceValues(func() (string, error) {
	path, err := lookPath("node", nodeFix)
	if err != nil {
		return "", err
	}
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("testserver: %s --version: %v", path, err)
	}
	m := regexp.MustCompile(`^v(\d+)\.`).FindStringSubmatch(string(out))
	if m == nil {
		return "", fmt.Errorf("testserver: cannot read the version of %s from %q", path, out)
	}
	if major, _ := strconv.Atoi(m[1]); major < 20 {
		return "", fmt.Errorf("testserver: %s is %s, but dynalite 4 and fauxqs need Node.js 20 or newer: %s",
			path, out, nodeFix)
	}
	return path, nil
})

// Node is an emulator running under Node.js: dynalite (DynamoDB) or fauxqs
// (SQS, SNS and S3), listening on 127.0.0.1 only and keeping its data in
// memory.
type Node struct {
	// Endpoint is the base URL, "http://127.0.0.1:port", to use as the AWS
	// SDK's endpoint (any region and credentials are accepted).
	Endpoint string

	proc *process
	dir  string
	once sync.Once
}

// toolFile returns the absolute path of a file under tools/node_modules.
func toolFile(rel string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	path := filepath.Join(root, "tools", "node_modules", filepath.FromSlash(rel))
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("testserver: %s is missing: %s", path, npmToolFix)
	}
	return path, nil
}

// StartDynalite starts dynalite (tools/node_modules/dynalite) on a free
// 127.0.0.1 port, in memory, with table creation, deletion and update
// taking no time, and returns once it answers HTTP. Call Close when done.
func StartDynalite() (*Node, error) {
	cli, err := toolFile("dynalite/cli.js")
	if err != nil {
		return nil, err
	}
	return startNode("dynalite", func(port int) ([]string, []string) {
		return []string{cli, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
			"--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"}, nil
	})
}

// fauxqsLauncher starts fauxqs's Fastify app on 127.0.0.1. fauxqs's own
// dist/cli.js (startFauxqs) always listens on 0.0.0.0: FAUXQS_HOST only
// changes the host written into queue URLs, not the bind address. So this
// uses the exported buildApp instead, honouring the same FAUXQS_HOST and
// FAUXQS_DEFAULT_REGION variables; FAUXQS_LOGGER=true turns request logs on.
const fauxqsLauncher = `
const { buildApp } = await import(process.argv[1]);
const app = buildApp({
  logger: process.env.FAUXQS_LOGGER === "true",
  host: process.env.FAUXQS_HOST || undefined,
  defaultRegion: process.env.FAUXQS_DEFAULT_REGION || undefined,
});
const address = await app.listen({ port: Number(process.env.FAUXQS_PORT), host: "127.0.0.1" });
console.log("fauxqs listening at " + address);
for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => app.close().then(() => process.exit(0)));
`

// StartFauxqs starts fauxqs (tools/node_modules/fauxqs, an SQS/SNS/S3
// emulator) on a free 127.0.0.1 port, in memory, and returns once it answers
// HTTP. Call Close when done.
func StartFauxqs() (*Node, error) {
	app, err := toolFile("fauxqs/dist/app.js")
	if err != nil {
		return nil, err
	}
	appURL := (&url.URL{Scheme: "file", Path: app}).String()
	return startNode("fauxqs", func(port int) ([]string, []string) {
		return []string{"--input-type=module", "--eval", fauxqsLauncher, appURL},
			[]string{"FAUXQS_PORT=" + strconv.Itoa(port)}
	})
}

func startNode(name string, argsFor func(port int) (args, env []string)) (*Node, error) {
	bin, err := nodeBinary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "testserver-"+name+"-*")
	if err != nil {
		return nil, err
	}
	var n *Node
	err = withFreshPorts(1, func(ports []int) error {
		args, env := argsFor(ports[0])
		endpoint := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
		p, err := launch(launchSpec{name: name + " " + endpoint, path: bin, args: args, env: env, dir: dir})
		if err != nil {
			return err
		}
		if err := p.waitReady(30*time.Second, func() error { return httpCheck(endpoint) }); err != nil {
			_ = p.kill()
			return err
		}
		n = &Node{Endpoint: endpoint, proc: p, dir: dir}
		return nil
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return n, nil
}

var probeClient = &http.Client{
	Timeout:   time.Second,
	Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true},
}

// httpCheck returns nil once endpoint answers an HTTP request with any status.
func httpCheck(endpoint string) error {
	if err := dialCheck(endpoint[len("http://"):]); err != nil {
		return err
	}
	resp, err := probeClient.Get(endpoint + "/")
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// Output returns the last lines the emulator printed.
func (n *Node) Output() string { return n.proc.out.Tail(8192) }

// Close kills the emulator, waits for it and removes its directory. It may
// be called more than once.
func (n *Node) Close() error {
	var err error
	n.once.Do(func() {
		_ = n.proc.kill()
		err = os.RemoveAll(n.dir)
	})
	return err
}
