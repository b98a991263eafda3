package testserver

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHelperProcess is not a real test: run by TestChildrenDieWithBinary
// with TESTSERVER_HELPER set, it starts servers, prints their pids and
// blocks until it is killed.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("TESTSERVER_HELPER") == "" {
		t.Skip("helper for TestChildrenDieWithBinary")
	}
	r, err := StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	n, err := StartDynalite()
	if err != nil {
		t.Fatal(err)
	}
	// A goroutine locked to a thread that then exits would fire Pdeathsig
	// if children were forked from it: they are not, and must survive.
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Exiting while locked terminates this OS thread.
		lockAndExit()
	}()
	<-done
	os.Stdout.WriteString("PIDS " + strconv.Itoa(r.proc.cmd.Process.Pid) + " " + strconv.Itoa(n.proc.cmd.Process.Pid) + "\n")
	select {}
}

func TestChildrenDieWithBinary(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.v")
	// The helper dies by SIGKILL and cannot remove its servers' directories:
	// keep them under a directory of ours.
	cmd.Env = append(os.Environ(), "TESTSERVER_HELPER=1", "TMPDIR="+t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var pids []int
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "PIDS" {
			for _, s := range f[1:] {
				p, _ := strconv.Atoi(s)
				pids = append(pids, p)
			}
			break
		}
	}
	if len(pids) != 2 {
		t.Fatalf("helper printed no pids (%v)", sc.Err())
	}
	time.Sleep(200 * time.Millisecond)
	for _, p := range pids {
		if !alive(p) {
			t.Fatalf("child %d died while the helper was alive", p)
		}
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	for _, p := range pids {
		waitDead(t, p, 5*time.Second)
	}
}

func TestMissingProgramErrors(t *testing.T) {
	_, err := lookPath("redis-server-does-not-exist", redisFix)
	if err == nil || !strings.Contains(err.Error(), "apt-get install -y redis-server") ||
		!strings.Contains(err.Error(), "make test") {
		t.Fatalf("err = %v", err)
	}
	_, err = toolFile("no-such-package/cli.js")
	if err == nil || !strings.Contains(err.Error(), "npm ci --prefix tools") {
		t.Fatalf("err = %v", err)
	}
}

func TestRepoRoot(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root + "/go.work"); err != nil {
		t.Fatalf("RepoRoot %s: %v", root, err)
	}
}

func TestStartupErrorHasOutput(t *testing.T) {
	p, err := launch(launchSpec{name: "sh", path: "/bin/sh", args: []string{"-c", "echo boom-marker >&2; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	err = p.waitReady(5*time.Second, func() error { return os.ErrNotExist })
	if err == nil || !strings.Contains(err.Error(), "boom-marker") {
		t.Fatalf("err = %v", err)
	}
	p, err = launch(launchSpec{name: "sh", path: "/bin/sh", args: []string{"-c", "echo 'bind: Address already in use'; exit 1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err = p.waitReady(5*time.Second, func() error { return os.ErrNotExist }); !isAddrInUse(err) {
		t.Fatalf("err = %v, want errAddrInUse", err)
	}
}
