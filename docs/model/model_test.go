package model_test

// Model-checks docs/model/claim.pml and docs/model/batch.pml with spin:
// the claim protocol of DESIGN.md and its batch path must satisfy their
// properties, and every variant that breaks an assumption (no heartbeat,
// process pauses) or the code (the mutants) must be caught. See README.md
// in this folder for the models, the bounds and the figures.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

const spinMissing = "spin not installed: run `make test` (installs it) or `apt-get install -y spin`"

// check is one pan run against a compiled model.
type check struct {
	claim      string // ltl block to check (pan -N); "" = assertions and end states only
	wantErrors bool   // true: spin must find a counterexample
	cause      string // wantErrors: text expected in pan's error report
	trail      bool   // wantErrors: replay the counterexample (spin -t) into the test log
	what       string // one line for the log
}

// build is one `spin -a` + gcc of a model with a set of -D flags.
type build struct {
	name     string
	model    string   // the .pml file; "" = claim.pml
	opt      string   // gcc optimization; "" = -O1 when a check must hold, else -O0
	defines  []string // spin -D flags
	liveness bool     // acceptance cycles under weak fairness (pan -a -f) instead of -DSAFETY
	bfs      bool     // breadth-first search: the shortest counterexample
	checks   []check
}

// builds, longest first: parallel subtests start in this order.
func builds() []build {
	bs := []build{
		{name: "liveness-3c1m", defines: []string{"-DNMSG=1", "-DMAXNET=0"}, liveness: true, checks: []check{
			{claim: "eventually_once", what: "P2: every message acked, effect ran once (3 consumers, 1 message, no lost requests)"},
		}},
		{name: "pauses", defines: []string{"-DPAUSES", "-DNCONS=2", "-DMAXNET=0"}, checks: []check{
			{claim: "owner_only", what: "P3 holds even when processes pause past their lease"},
		}},
		{name: "fenced-pauses", defines: []string{"-DFENCED", "-DPAUSES", "-DNCONS=2", "-DMAXNET=0"}, checks: []check{
			{claim: "fenced_order", what: "P5: with fences, the downstream never accepts a claim's write after a later claim's, however long processes pause"},
		}},
		{name: "real", defines: []string{"-DMAXNET=0"}, checks: []check{
			{claim: "at_most_once", what: "P1: at most once (one extra run per crash between effect and Complete), 3 consumers"},
			{claim: "owner_only", what: "P3: Complete/Release/Extend only change a record their claim created, 3 consumers"},
		}},
		{name: "real-lost-requests", defines: []string{"-DNCONS=2"}, checks: []check{
			{claim: "at_most_once", what: "P1 with a lost request (a hung Extend, a failed Complete retried), 2 consumers"},
			{claim: "owner_only", what: "P3 with a lost request, 2 consumers"},
		}},
		{name: "real-bfs", bfs: true, checks: []check{
			{claim: "strictly_once", wantErrors: true, cause: "effects<=1", trail: true,
				what: "limit: a crash between the effect and Complete lets the effect run again"},
		}},
		{name: "timelock-free", defines: []string{"-DNOLTL", "-DNCONS=2"}, checks: []check{
			{what: "no assertion fails, no state where time stops and nothing can move"},
		}},
		{name: "txn-complete", defines: []string{"-DTXN_COMPLETE", "-DMAXNET=0"}, checks: []check{
			{claim: "strictly_once", what: "P1 strict: effect and Complete in one transaction run at most once"},
		}},
		{name: "txn-complete-lost-requests", defines: []string{"-DTXN_COMPLETE", "-DNCONS=2"}, checks: []check{
			{claim: "strictly_once", what: "P1 strict: effect and Complete in one transaction run at most once"},
		}},
		{name: "txn-complete-pauses", defines: []string{"-DTXN_COMPLETE", "-DPAUSES", "-DNCONS=2"}, checks: []check{
			{claim: "strictly_once", what: "a transaction that checks the token fences off paused owners"},
		}},
		{name: "liveness-2c2m", defines: []string{"-DNCONS=2"}, liveness: true, checks: []check{
			{claim: "eventually_once", what: "P2: every message acked, effect ran once (2 consumers, 2 messages, a lost Extend or Complete)"},
		}},
		{name: "liveness-txn-2c2m", defines: []string{"-DTXN_COMPLETE", "-DNCONS=2"}, liveness: true, checks: []check{
			{claim: "eventually_once", what: "P2 with TXN_COMPLETE: exactly once (torn is always 0)"},
		}},
		{name: "pauses-bfs", defines: []string{"-DPAUSES", "-DNCONS=2"}, bfs: true, checks: []check{
			{claim: "at_most_once", wantErrors: true, cause: "effects<=(1+torn)", trail: true,
				what: "limit: a whole-process pause defeats the lease (heartbeat included)"},
		}},
		{name: "fenced-pauses-bfs", defines: []string{"-DFENCED", "-DPAUSES", "-DNCONS=2"}, bfs: true, checks: []check{
			{claim: "at_most_once", wantErrors: true, cause: "effects<=(1+torn)", trail: true,
				what: "limit: with fences, a paused holder's write that lands before its successor's is accepted, and the successor's after it"},
		}},
		{name: "mutant-fence-reuse", defines: []string{"-DFENCED", "-DMUTANT_FENCE_REUSE", "-DPAUSES", "-DNCONS=2"}, bfs: true, checks: []check{
			{claim: "fenced_order", wantErrors: true, cause: "late", trail: true,
				what: "mutant: a takeover given the fence of the claim it replaces lets the paused holder's write in after its successor's"},
		}},
		{name: "mutant-no-fence-check", defines: []string{"-DFENCED", "-DMUTANT_NO_FENCE_CHECK", "-DPAUSES", "-DNCONS=2"}, bfs: true, checks: []check{
			{claim: "fenced_order", wantErrors: true, cause: "late", trail: true,
				what: "mutant: a downstream without the fence condition accepts the paused holder's write after its successor's"},
		}},
		{name: "no-heartbeat", defines: []string{"-DNO_HEARTBEAT"}, bfs: true, checks: []check{
			{claim: "at_most_once", wantErrors: true, cause: "effects<=(1+torn)", trail: true,
				what: "P4: without the heartbeat a Complete retried past the lease lets a second claim run the effect"},
		}},
		{name: "heartbeat-at-deadline", defines: []string{"-DHB=2"}, bfs: true, checks: []check{
			{claim: "at_most_once", wantErrors: true, cause: "effects<=(1+torn)", trail: true,
				what: "Heartbeat >= Lease - margin: no extension is ever sent, so a retried Complete outlives the lease"},
		}},
		{name: "mutant-late-cancel", defines: []string{"-DMUTANT_LATE_CANCEL"}, bfs: true, checks: []check{
			{claim: "at_most_once", wantErrors: true, cause: "effects<=(1+torn)", trail: true,
				what: "mutant (9525892): the lease's end checked only when a hung Extend returns lets the handler overlap a takeover"},
		}},
		{name: "mutant-hb-stops-at-complete", defines: []string{"-DMUTANT_HB_STOPS_AT_COMPLETE"}, bfs: true, checks: []check{
			{claim: "at_most_once", wantErrors: true, cause: "effects<=(1+torn)", trail: true,
				what: "mutant (9525892): the heartbeat stopped before Complete lets a retried Complete land after the lease"},
		}},
		{name: "mutant-release-no-token", defines: []string{"-DMUTANT_RELEASE_NO_TOKEN", "-DPAUSES", "-DNCONS=2"}, bfs: true, checks: []check{
			{claim: "owner_only", wantErrors: true, cause: "foreign", trail: true,
				what: "mutant: Release without the token compare deletes another claim's record"},
		}},
		{name: "mutant-ack-inprogress", defines: []string{"-DMUTANT_ACK_INPROGRESS"}, liveness: true, checks: []check{
			{claim: "eventually_once", wantErrors: true, cause: "acceptance cycle", trail: true,
				what: "mutant: acking an InProgress copy loses the message when the owner fails"},
		}},
		{name: "reach-takeover", defines: []string{"-DNOLTL", "-DREACH_TAKEOVER"}, bfs: true, checks: []check{
			{wantErrors: true, cause: "rstate!=1", what: "sanity: a Claim does take over an expired lease"},
		}},
		{name: "reach-long-handler", defines: []string{"-DNOLTL", "-DREACH_LONG_HANDLER"}, bfs: true, checks: []check{
			{wantErrors: true, cause: "span[i]<=3", what: "sanity: a handler outlives its lease and the heartbeat keeps the claim"},
		}},
		{name: "reach-fence-refused", defines: []string{"-DNOLTL", "-DREACH_FENCE_REFUSED", "-DFENCED", "-DPAUSES", "-DNCONS=2"}, bfs: true, checks: []check{
			{wantErrors: true, cause: "fen[i]>=dfence", what: "sanity: the downstream does refuse a paused holder's write"},
		}},
		{name: "reach-foreign-refused", defines: []string{"-DNOLTL", "-DREACH_FOREIGN_REFUSED", "-DPAUSES", "-DNCONS=2"}, bfs: true, checks: []check{
			{wantErrors: true, cause: "rtok!=tok[", what: "sanity: the token check does turn away a call on another claim's live record"},
		}},
	}
	if os.Getenv("DEDUP_MODEL_FULL") != "" {
		// 3 consumers and 2 messages under weak fairness: about 30 s alone.
		bs = append([]build{{name: "liveness-3c2m", liveness: true, checks: []check{
			{claim: "eventually_once", what: "P2: every message acked, effect ran once (3 consumers, 2 messages)"},
		}}}, bs...)
	}
	return bs
}

func TestClaimModel(t *testing.T) { testModel(t, "claim.pml", builds()) }

// testModel compiles each build of one model and runs its checks, in
// parallel subtests.
func testModel(t *testing.T, file string, bs []build) {
	spin, err := exec.LookPath("spin")
	if err != nil {
		t.Fatal(spinMissing)
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Fatal(spinMissing + " (and gcc: apt-get install -y gcc)")
	}
	model, err := filepath.Abs(file)
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		b.model = file
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			dir := compile(t, spin, gcc, src, b)
			for _, c := range b.checks {
				name := c.claim
				if name == "" {
					name = "assertions"
				}
				t.Run(name, func(t *testing.T) { verify(t, spin, dir, b, c) })
			}
		})
	}
}

// modelFile is the .pml file of a build.
func modelFile(b build) string {
	if b.model == "" {
		return "claim.pml"
	}
	return b.model
}

// compile generates pan.c with spin and builds it with gcc in a temp dir.
func compile(t *testing.T, spin, gcc string, src []byte, b build) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, modelFile(b)), src, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, dir, spin, append(append([]string{"-a"}, b.defines...), modelFile(b))...)
	// Compiling pan.c costs more than most searches: -O2 takes 2.0 s of CPU,
	// -O1 1.1 s for a pan just as fast (measured on this model), -O0 0.4 s.
	// A build that only looks for a counterexample stops after a few
	// thousand states, so it gets -O0.
	opt := "-O0"
	for _, c := range b.checks {
		if !c.wantErrors {
			opt = "-O1"
		}
	}
	if b.opt != "" {
		opt = b.opt
	}
	flags := []string{opt, "-w", "-DMEMLIM=2048", "-o", "pan", "pan.c"}
	switch {
	case b.liveness:
		flags = append(flags, "-DNFAIR=3") // 6 processes + the never claim
	case b.bfs:
		flags = append(flags, "-DSAFETY", "-DBFS")
	default:
		flags = append(flags, "-DSAFETY")
	}
	run(t, dir, gcc, flags...)
	return dir
}

var (
	reErrors  = regexp.MustCompile(`errors: (\d+)`)
	reStored  = regexp.MustCompile(`(\S+) states, stored`)
	reVisited = regexp.MustCompile(`states, stored \((\S+) visited\)`)
	reTrans   = regexp.MustCompile(`(\S+) transitions`)
	reDepth   = regexp.MustCompile(`depth reached (\d+)`)
	reElapsed = regexp.MustCompile(`pan: elapsed time (\S+) seconds`)
	reReport  = regexp.MustCompile(`(?m)^pan:\d+: .*$`)
)

// incomplete marks a search that did not cover the whole state space: its
// "errors: 0" would prove nothing.
var incomplete = []string{
	"max search depth too small",
	"reached -DMEMLIM bound",
	"out of memory",
	"pan: error",
	"too many processes",
	"Warning: Search not completed",
}

func verify(t *testing.T, spin, dir string, b build, c check) {
	args := []string{"-m100000", "-w22"}
	if b.liveness {
		args = append(args, "-a", "-f")
	}
	if c.claim != "" {
		args = append(args, "-N", c.claim)
	}
	out := run(t, dir, "./pan", args...)
	m := reErrors.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no \"errors: N\" in pan's output:\n%s", out)
	}
	errs, _ := strconv.Atoi(m[1])
	if errs == 0 {
		for _, bad := range incomplete {
			if strings.Contains(out, bad) {
				t.Fatalf("incomplete search (%q), so no error proves nothing:\n%s", bad, out)
			}
		}
	}
	t.Logf("%s: %s", b.name, c.what)
	defines := strings.Join(b.defines, " ")
	if defines == "" {
		defines = "(no -D)"
	}
	t.Logf("spin -a %s %s; pan %s: errors %d, states stored %s%s, transitions %s, depth reached %s, %ss",
		defines, modelFile(b), strings.Join(args, " "), errs,
		first(reStored, out), visited(out), first(reTrans, out), first(reDepth, out), first(reElapsed, out))
	report := reReport.FindString(out)
	switch {
	case !c.wantErrors && errs != 0:
		t.Errorf("spin found %d error(s), want none: %s\n%s", errs, report, replay(t, spin, dir, b))
	case c.wantErrors && errs == 0:
		t.Errorf("spin found no error: the model does not reach the case %q", c.what)
	case c.wantErrors && !strings.Contains(out, c.cause):
		t.Errorf("spin found an error, but not the expected one (%q): %s", c.cause, report)
	case c.wantErrors:
		t.Logf("found as expected: %s", report)
		if c.trail {
			t.Logf("counterexample (spin -t):\n%s", replay(t, spin, dir, b))
		}
	}
}

// replay returns the MSC lines of the trail pan wrote, one step a line.
func replay(t *testing.T, spin, dir string, b build) string {
	if _, err := os.Stat(filepath.Join(dir, modelFile(b)+".trail")); err != nil {
		return "(no trail)"
	}
	out := run(t, dir, spin, append(append([]string{"-t"}, b.defines...), modelFile(b))...)
	var steps []string
	for _, l := range strings.Split(out, "\n") {
		if _, msc, ok := strings.Cut(l, "MSC: "); ok {
			steps = append(steps, fmt.Sprintf("  %2d. %s", len(steps)+1, msc))
		}
	}
	return strings.Join(steps, "\n")
}

func first(re *regexp.Regexp, s string) string {
	if m := re.FindStringSubmatch(s); m != nil {
		return m[1]
	}
	return "?"
}

func visited(s string) string {
	if m := reVisited.FindStringSubmatch(s); m != nil {
		return " (" + m[1] + " visited with fairness)"
	}
	return ""
}

// run runs a command in dir and returns its combined output; any failure
// to run it, or a non-zero exit, fails the test.
func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String()
}
