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

// asProgram makes the test binary run main instead of the tests: the test
// runs the program in a process of its own, which a deadline can kill.
const asProgram = "FENCING_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asProgram) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// deadline bounds a run of the program, which takes two leases and a
// little more.
const deadline = time.Minute

// want is what the program prints: with the fence checked, A's late
// charge is refused, its handler's error nacks the message, and the
// redelivery is a duplicate: one charge. Without the check: two.
const want = `The charges table checks the fence:
  A claims ORDER-003 and freezes before it charges (a GC pause, a frozen VM)
  A's lease ends; B takes ORDER-003 over with a larger fence and charges 150: accepted
  A wakes and charges 150 with its smaller fence: refused
  A's handler returns the refusal, matching dedup.ErrClaimLost: the message is nacked
  the message comes back to A: a duplicate, acked
  ORDER-003 charged 1 time(s)
The charges table does not check the fence:
  A claims ORDER-003 and freezes before it charges (a GC pause, a frozen VM)
  A's lease ends; B takes ORDER-003 over with a larger fence and charges 150: accepted
  A wakes and charges 150 with its smaller fence: accepted
  A's handler returns nil; its Complete is refused (B completed the order)
  ORDER-003 charged 2 time(s)
`

func TestFencedTableChargesOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), asProgram+"=1")
	cmd.WaitDelay = 5 * time.Second
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("the program did not finish within %v and was killed:\n%s%s", deadline, out.String(), errOut.String())
	}
	if err != nil {
		t.Fatalf("the program: %v\n%s%s", err, out.String(), errOut.String())
	}
	if out.String() != want {
		t.Errorf("printed\n%s\nwant\n%s", out.String(), want)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "$ go run ./examples/fencing\n"+want) {
		t.Errorf("examples/fencing/README.md does not show the command and its output:\n$ go run ./examples/fencing\n%s", want)
	}
}
