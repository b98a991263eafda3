package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// asProgram makes the test binary run main instead of the tests: the tests
// run the program in a process of its own, which a deadline can kill.
const asProgram = "MIGRATING_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asProgram) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// deadline bounds a run of the program, which takes well under a second:
// past it, the router is taken to hang.
const deadline = time.Minute

// runProgram runs the program with args and returns its stdout and stderr.
// It fails the test, with the log's last lines, when the program exits
// with an error or runs past the deadline.
func runProgram(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), asProgram+"=1")
	cmd.WaitDelay = 5 * time.Second
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("the program %v did not finish within %v and was killed: the router hangs (a message refused by dedup is poisoned again, "+
			"for instance, when the poison topic's reader is deduplicated too). The log's last lines:\n%s", args, deadline, lastLines(errOut.String(), 8))
	}
	if err != nil {
		t.Fatalf("the program %v: %v\n%s", args, err, lastLines(errOut.String(), 20))
	}
	return out.String(), errOut.String()
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// count returns how many lines of log carry the dedup event.
func count(log, event string) int {
	return strings.Count(log, `msg="dedup: `+event+`"`)
}

// Enforcing: one charge for ten copies, the message without order_id on
// the poison topic once and read there (the reader is not deduplicated, so
// the program ends), one key_missing error line, nine skip_duplicate lines.
func TestEnforcingEndsWithOneChargeAndOnePoisonedMessage(t *testing.T) {
	stdout, stderr := runProgram(t)
	const want = "10 copies of ORDER-003 and 1 message without order_id: 1 charge(s); 1 message(s) on orders.poison\n"
	if stdout != want {
		t.Errorf("printed %q, want %q", stdout, want)
	}
	if n := count(stderr, "skip_duplicate"); n != 9 {
		t.Errorf("logged %d skip_duplicate lines, want 9:\n%s", n, stderr)
	}
	if n := count(stderr, "key_missing"); n != 1 || strings.Count(stderr, "level=ERROR") != 1 || strings.Contains(stderr, "handler=read-poison") {
		t.Errorf("logged %d key_missing lines, %d ERROR lines in all; want one of each, from charge-orders, none from read-poison:\n%s",
			n, strings.Count(stderr, "level=ERROR"), stderr)
	}
	checkReadmeShows(t, "$ go run ./examples/migrating 2>/dev/null\n"+want)
}

// Shadow mode (the guide's first deployment): every message runs the
// handler, none is poisoned, and the log, through the Logger set in the
// configuration, says what enforcing would change: nine would_skip, one
// would_reject.
func TestShadowRunsEveryMessageAndLogsWhatEnforcingWouldChange(t *testing.T) {
	stdout, stderr := runProgram(t, "-shadow")
	const want = "10 copies of ORDER-003 and 1 message without order_id: 11 charge(s); 0 message(s) on orders.poison\n"
	if stdout != want {
		t.Errorf("printed %q, want %q", stdout, want)
	}
	if n := count(stderr, "would_skip"); n != 9 {
		t.Errorf("logged %d would_skip lines, want 9:\n%s", n, stderr)
	}
	if n := count(stderr, "would_reject"); n != 1 {
		t.Errorf("logged %d would_reject lines, want 1:\n%s", n, stderr)
	}
	checkReadmeShows(t, "$ go run ./examples/migrating -shadow 2>/dev/null\n"+want)
}

// checkReadmeShows fails the test unless the example's README shows text.
func checkReadmeShows(t *testing.T, text string) {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), text) {
		t.Errorf("examples/migrating/README.md does not show\n%s", text)
	}
}
