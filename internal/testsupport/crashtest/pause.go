package crashtest

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Pause reports point (with value) to the parent, as Say does, and stops
// the whole process with SIGSTOP: every goroutine, its timers and its
// heartbeats freeze, as in a long GC pause or a frozen VM. It returns when
// the parent resumes the process (Child.Continue). The parent knows the
// process is stopped once Child.WaitStopped returns.
//
//	if crashtest.IsChild(t) {
//		... claim ...
//		crashtest.Pause("held", fence) // frozen here until Continue
//		... the effect, late ...
//	}
//	c := crashtest.Start(t, nil)
//	c.Wait(t, "held")
//	c.WaitStopped(t)
//	... time passes, another process acts ...
//	c.Continue(t)
func Pause(point, value string) {
	Say(point, value)
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
}

// WaitStopped waits until the child is stopped by a signal (its state in
// /proc is T), as Pause leaves it. It fails the test if the child exits
// first or WaitTimeout passes.
func (c *Child) WaitStopped(t testing.TB) {
	t.Helper()
	stat := "/proc/" + strconv.Itoa(c.cmd.Process.Pid) + "/stat"
	deadline := time.Now().Add(WaitTimeout)
	for {
		select {
		case <-c.exited:
			t.Fatalf("crashtest: the child exited instead of stopping:\n%s", c.Output())
		default:
		}
		b, err := os.ReadFile(stat)
		if err != nil {
			t.Fatalf("crashtest: reading the child's state: %v", err)
		}
		// pid (comm) state ...: the state is the field after the last ')'.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'T' {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("crashtest: the child did not stop within %v:\n%s", WaitTimeout, c.Output())
		}
		time.Sleep(time.Millisecond) // polling /proc: no event tells a stop
	}
}

// Continue resumes a stopped child with SIGCONT.
func (c *Child) Continue(t testing.TB) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("crashtest: SIGCONT: %v", err)
	}
}
