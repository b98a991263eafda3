package main

import (
	"bufio"
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

// fauxqs.mjs, the script the hints point to, starts an emulator that the
// example's AWS configuration talks to, on 127.0.0.1.
func TestFauxqsScript(t *testing.T) {
	root, err := testserver.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()

	// The child is killed when this goroutine's thread exits (it stays
	// locked), even if the test binary dies before the cleanup runs.
	runtime.LockOSThread()
	cmd := exec.Command("node", filepath.Join(root, "examples", "sqs", "fauxqs.mjs"))
	cmd.Env = append(cmd.Environ(), "FAUXQS_PORT="+strconv.Itoa(port))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		if s.Scan() {
			line <- s.Text()
		}
		close(line)
	}()
	select {
	case got := <-line:
		want := "fauxqs (SQS, SNS) listening at http://127.0.0.1:" + strconv.Itoa(port)
		if !strings.HasPrefix(got, want) {
			t.Fatalf("first line %q, want %q…", got, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("fauxqs.mjs printed nothing within 30s")
	}
	t.Setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:"+strconv.Itoa(port))
	awsCfg, err := loadAWS(context.Background(), "sqs", "sns")
	if err != nil {
		t.Fatal(err)
	}
	if err := pingSQS(context.Background(), awsCfg); err != nil {
		t.Fatal(err)
	}
}
