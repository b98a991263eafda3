// Package crashtest crashes a process at a chosen instant, for tests: a
// test re-executes its own binary as a child process running the same
// test, the child reports on its standard output when it reaches the
// point, and blocks there; the parent waits for that report and kills the
// child with SIGKILL. No sleeps decide when the crash happens. A child can
// also freeze itself at a point (Pause: SIGSTOP, as a GC pause or a frozen
// VM would freeze it) until the parent resumes it (Child.Continue).
//
//	func TestCrash(t *testing.T) {
//		if crashtest.IsChild(t) {
//			... work ...
//			crashtest.Reach("written") // blocks until killed
//		}
//		c := crashtest.Start(t, nil)
//		c.Wait(t, "written")
//		c.Kill(t)
//		... check what survived ...
//	}
package crashtest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// envChild names the test a child process runs.
const envChild = "CRASHTEST_CHILD"

// prefix starts every line a child reports.
const prefix = "crashtest: "

// WaitTimeout bounds each Wait: generous, for a machine busy with other
// test processes.
const WaitTimeout = 2 * time.Minute

// IsChild reports whether this process is the child started by Start for
// the running test.
func IsChild(t testing.TB) bool { return os.Getenv(envChild) == t.Name() }

// InChild reports whether this process is a child started by Start, for
// a TestMain that must not start again what the parent shares with its
// children (servers).
func InChild() bool { return os.Getenv(envChild) != "" }

// Say reports a named value to the parent (an address, a count), which
// reads it with Wait.
func Say(point, value string) {
	fmt.Printf("%s%s %s\n", prefix, point, value)
	_ = os.Stdout.Sync()
}

// Reach reports that the child reached point, and blocks until the parent
// kills the process.
func Reach(point string) {
	Say(point, "")
	for {
		time.Sleep(time.Hour) // a sleeping goroutine: never a deadlock panic
	}
}

// Child is a child process running one test.
type Child struct {
	cmd    *exec.Cmd
	lines  chan string // reported lines, without prefix
	exited chan struct{}

	mu     sync.Mutex
	output strings.Builder // everything else the child printed, for failures
}

// Start runs the current test in a child process, with env (KEY=value)
// added to this process's environment. The child is killed when the test
// ends, if it still runs.
func Start(t testing.TB, env []string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.timeout=10m")
	cmd.Env = append(append(os.Environ(), envChild+"="+t.Name()), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &Child{cmd: cmd, lines: make(chan string, 64), exited: make(chan struct{})}
	cmd.Stderr = writerFunc(func(p []byte) (int, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.output.Write(p)
	})
	if err := cmd.Start(); err != nil {
		t.Fatalf("crashtest: starting the child: %v", err)
	}
	go func() {
		defer close(c.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				c.lines <- rest
				continue
			}
			c.mu.Lock()
			c.output.WriteString(line + "\n")
			c.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.exited
	})
	return c
}

// Wait waits until the child reports point and returns the value it said
// with it. It fails the test if the child exits first or WaitTimeout
// passes.
func (c *Child) Wait(t testing.TB, point string) string {
	t.Helper()
	timeout := time.NewTimer(WaitTimeout)
	defer timeout.Stop()
	for {
		select {
		case line := <-c.lines:
			name, value, _ := strings.Cut(line, " ")
			if name == point {
				return value
			}
		case <-c.exited:
			t.Fatalf("crashtest: the child exited before reaching %q:\n%s", point, c.Output())
		case <-timeout.C:
			t.Fatalf("crashtest: the child did not reach %q within %v:\n%s", point, WaitTimeout, c.Output())
		}
	}
}

// Kill kills the child with SIGKILL and waits until it is gone: a crash,
// with no deferred function, no Close, no flush.
func (c *Child) Kill(t testing.TB) {
	t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatalf("crashtest: kill: %v", err)
	}
	select {
	case <-c.exited:
	case <-time.After(WaitTimeout):
		t.Fatalf("crashtest: the killed child did not exit within %v", WaitTimeout)
	}
}

// Output is what the child printed besides its reports.
func (c *Child) Output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.output.String()
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
