package docs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// Every dedup-lab and dedupctl command line quoted in Markdown (in a code
// block, or a code span) passes the command's own flag parsing: the test
// builds each command with one file added (go build -overlay, nothing in
// the tree changes) whose init runs the quoted arguments through the
// command's parser and exits. For dedup-lab that is parseFlags, which
// checks every flag and value (-broker and -store against the lab's
// backends, -idempotency, -runtime) and their combinations. For dedupctl
// it is run, with openStore given a cancelled context and loopback
// addresses, so a command line gets as far as the store's name and reaches
// no server. `make lab` lines may pass only the variables the Makefile's
// lab recipe hands to the lab. The lab's flag table (the code block under
// "Flags" in dev/lab/README.md) lists every flag, and every value
// of the flags that take one of a set.
func TestQuotedCommandLinesParse(t *testing.T) {
	root := repoRoot(t)
	docs := loadRepository(t, root).markdownFiles(t)
	res := checkCommandLines(t, buildFlagCheckers(t, root), docs, labMakeVars(t, root), "dev/lab/README.md")
	for _, p := range res.problems {
		t.Error(p)
	}
	t.Logf("dedup-lab: %d command lines (%d runs with alternatives expanded, %d flags); dedupctl: %d command lines (%d flags); %d synopsis lines skipped; the flag table: %d flags",
		res.labLines, res.labRuns, res.labFlags, res.ctlLines, res.ctlFlags, res.synopses, res.tableFlags)
}

// labHook is added to dev/lab: with DOCS_FLAGCHECK naming a JSON file
// of argument lists, it parses each with parseFlags, prints the first line
// of each refusal ("" for accepted) and the usage as JSON, and exits.
const labHook = `package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
)

func init() {
	in := os.Getenv("DOCS_FLAGCHECK")
	if in == "" {
		return
	}
	b, err := os.ReadFile(in)
	if err != nil {
		panic(err)
	}
	var lines [][]string
	if err := json.Unmarshal(b, &lines); err != nil {
		panic(err)
	}
	var out struct {
		Usage   string
		Refused []string
	}
	var usage bytes.Buffer
	parseFlags([]string{"-h"}, &usage)
	out.Usage = usage.String()
	for _, args := range lines {
		var stderr bytes.Buffer
		msg := ""
		if _, err := parseFlags(args, &stderr); err != nil && !strings.HasPrefix(stderr.String(), "usage:") { // usage: -h
			msg, _, _ = strings.Cut(strings.TrimSpace(stderr.String()+"\n"+err.Error()), "\n")
		}
		out.Refused = append(out.Refused, msg)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		panic(err)
	}
	os.Exit(0)
}
`

// ctlHook is added to cmd/dedupctl, whose openStore is renamed
// docsOpenStore: run goes as far as opening the store, which gets a
// cancelled context and loopback addresses (the test's environment sets
// REDIS_ADDR, DATABASE_URL and AWS_ENDPOINT_URL to closed loopback ports),
// so nothing is reached; a usage error is passed on, anything else becomes
// errDocsAccepted (exit status 1).
const ctlHook = `package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
)

var errDocsAccepted = errors.New("docs: flags accepted")

func openStore(ctx context.Context, opts options) (admin.Interface, string, func(), error) {
	if opts.redisAddr != "" {
		client, err := redisClient(opts.redisAddr)
		if err != nil {
			return nil, "", nil, err
		}
		_ = client.Close()
	}
	opts.redisAddr = os.Getenv("REDIS_ADDR")
	opts.pgDSN = os.Getenv("DATABASE_URL")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, _, closeStore, err := docsOpenStore(cancelled, opts)
	if closeStore != nil {
		closeStore()
	}
	var u *usageError
	if errors.As(err, &u) {
		return nil, "", nil, err
	}
	return nil, "", nil, errDocsAccepted
}

func init() {
	in := os.Getenv("DOCS_FLAGCHECK")
	if in == "" {
		return
	}
	b, err := os.ReadFile(in)
	if err != nil {
		panic(err)
	}
	var lines [][]string
	if err := json.Unmarshal(b, &lines); err != nil {
		panic(err)
	}
	var out struct{ Refused []string }
	for _, args := range lines {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), args, &stdout, &stderr)
		msg := ""
		switch {
		case code == 1 && strings.Contains(stderr.String(), errDocsAccepted.Error()):
		case code == 0 && len(args) > 0 && (args[len(args)-1] == "-h" || args[0] == "help"):
		default:
			msg, _, _ = strings.Cut(strings.TrimSpace(stderr.String()), "\n")
			msg = fmt.Sprintf("exit status %d: %s", code, msg)
		}
		out.Refused = append(out.Refused, msg)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		panic(err)
	}
	os.Exit(0)
}
`

// flagCheckers are the two commands built with their hooks.
type flagCheckers struct{ lab, ctl string }

// TestMain removes the flag checkers' folder after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if checkersDir != "" {
		_ = os.RemoveAll(checkersDir)
	}
	os.Exit(code)
}

var (
	checkersDir  string
	checkersOnce sync.Once
	checkers     flagCheckers
	checkersErr  error
)

// buildFlagCheckers builds dedup-lab and dedupctl with their hooks, once
// per test binary.
func buildFlagCheckers(t *testing.T, root string) flagCheckers {
	t.Helper()
	checkersOnce.Do(func() {
		dir, err := os.MkdirTemp("", "docs-flagcheck-")
		if err != nil {
			checkersErr = err
			return
		}
		checkersDir = dir // TestMain removes it
		stores, err := os.ReadFile(filepath.Join(root, "cmd", "dedupctl", "stores.go"))
		if err != nil {
			checkersErr = err
			return
		}
		const decl = "func openStore("
		if bytes.Count(stores, []byte(decl)) != 1 {
			checkersErr = fmt.Errorf("cmd/dedupctl/stores.go: want one %q to rename (docs/flags_test.go relies on it)", decl)
			return
		}
		files := map[string]string{
			"lab-hook.go":   labHook,
			"ctl-hook.go":   ctlHook,
			"ctl-stores.go": string(bytes.Replace(stores, []byte(decl), []byte("func docsOpenStore("), 1)),
		}
		for name, src := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
				checkersErr = err
				return
			}
		}
		overlay := map[string]map[string]string{"Replace": {
			filepath.Join(root, "dev", "lab", "zz_docs_flagcheck.go"):      filepath.Join(dir, "lab-hook.go"),
			filepath.Join(root, "cmd", "dedupctl", "zz_docs_flagcheck.go"): filepath.Join(dir, "ctl-hook.go"),
			filepath.Join(root, "cmd", "dedupctl", "stores.go"):            filepath.Join(dir, "ctl-stores.go"),
		}}
		b, _ := json.Marshal(overlay)
		overlayFile := filepath.Join(dir, "overlay.json")
		if err := os.WriteFile(overlayFile, b, 0o644); err != nil {
			checkersErr = err
			return
		}
		c := flagCheckers{lab: filepath.Join(dir, "lab"), ctl: filepath.Join(dir, "dedupctl")}
		if out, err := goCommand(t, root, "build", "-ldflags=-s -w", "-overlay", overlayFile, "-o", dir+string(filepath.Separator), "./dev/lab", "./cmd/dedupctl"); err != nil {
			checkersErr = fmt.Errorf("go build ./dev/lab ./cmd/dedupctl with the flag-check hooks: %v\n%s", err, out)
			return
		}
		checkers = c
	})
	if checkersErr != nil {
		t.Fatal(checkersErr)
	}
	return checkers
}

// ask runs a checker on argument lists and decodes its JSON answer into out.
func (c flagCheckers) ask(t *testing.T, bin string, lines [][]string, out any) {
	t.Helper()
	in := filepath.Join(t.TempDir(), "lines.json")
	b, _ := json.Marshal(lines)
	if err := os.WriteFile(in, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(), "DOCS_FLAGCHECK="+in,
		// Closed loopback ports: dedupctl's stores reach nothing else.
		"REDIS_ADDR=127.0.0.1:1", "DATABASE_URL=postgres://docs@127.0.0.1:1/docs?connect_timeout=1",
		"AWS_ENDPOINT_URL=http://127.0.0.1:1", "AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=docs",
		"AWS_SECRET_ACCESS_KEY=docs", "AWS_EC2_METADATA_DISABLED=true")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, stderr.String())
	}
	if err := json.Unmarshal(stdout, out); err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, stdout)
	}
}

// commandLine is a dedup-lab or dedupctl command quoted in Markdown.
type commandLine struct {
	where  string
	tool   string // "dedup-lab" or "dedupctl"
	inline bool   // from a code span
	text   string
	args   [][]string // the arguments, one list per combination of a|b alternatives
}

var (
	envAssignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)
	shellOperator = regexp.MustCompile(`^(\||\|\||&&|;|&|[0-9]*[<>].*)$`)
)

// quotedCommands finds the command lines of m: the lines of its code
// blocks (only the "$ " ones in a block that shows a prompt), continued
// with a trailing backslash and without their # comments, and its code
// spans. A command is `go run ./dev/lab`, `make lab`, `dedupctl` or
// `go run ./cmd/dedupctl` at the start of a command (after NAME=value
// assignments, or after && ; |); its arguments run to the next shell
// operator or "...". makeVars are the variables `make lab` passes on to
// the lab. A line with [optional] or <placeholder> arguments is a
// synopsis, counted and skipped.
func quotedCommands(m *markdown, makeVars map[string]bool) (cmds []commandLine, synopses int, problems []string) {
	type quoted struct {
		line   int
		text   string
		inline bool
	}
	var texts []quoted
	for _, b := range m.blocks {
		if lang, _, _ := strings.Cut(b.info, " "); lang == "go" {
			continue
		}
		lines := strings.Split(strings.TrimSuffix(b.code, "\n"), "\n")
		prompt := false
		for _, l := range lines {
			if strings.HasPrefix(l, "$ ") {
				prompt = true
			}
		}
		for i := 0; i < len(lines); i++ {
			start, l := i, lines[i]
			for strings.HasSuffix(l, "\\") && i+1 < len(lines) {
				i++
				l = strings.TrimSuffix(l, "\\") + " " + lines[i]
			}
			if prompt {
				if !strings.HasPrefix(l, "$ ") {
					continue
				}
				l = l[2:]
			}
			texts = append(texts, quoted{line: b.line + 1 + start, text: l})
		}
	}
	_, spans := m.scanCodeSpans()
	for _, s := range spans {
		texts = append(texts, quoted{line: s.line, text: strings.TrimPrefix(s.text, "$ "), inline: true})
	}
	for _, q := range texts {
		tokens := shellFields(q.text)
		for i := 0; i < len(tokens); i++ {
			// The start of a command: skip NAME=value.
			for i < len(tokens) && envAssignment.MatchString(tokens[i]) {
				i++
			}
			tool, n := "", 0
			switch rest := tokens[i:]; {
			case len(rest) >= 3 && rest[0] == "go" && rest[1] == "run" && strings.TrimSuffix(rest[2], "/") == "./dev/lab":
				tool, n = "dedup-lab", 3
			case len(rest) >= 3 && rest[0] == "go" && rest[1] == "run" && strings.TrimSuffix(rest[2], "/") == "./cmd/dedupctl":
				tool, n = "dedupctl", 3
			case len(rest) >= 2 && rest[0] == "make" && rest[1] == "lab":
				tool, n = "make lab", 2
			case len(rest) >= 1 && rest[0] == "dedupctl":
				tool, n = "dedupctl", 1
			}
			// The arguments, up to the next operator.
			j := i + n
			for j < len(tokens) && !shellOperator.MatchString(tokens[j]) {
				j++
			}
			args := tokens[i+n : j]
			i = j
			if tool == "" {
				continue
			}
			where := m.where(q.line)
			for k, a := range args {
				if a == "..." || a == "…" {
					args = args[:k]
					break
				}
			}
			if strings.ContainsAny(strings.Join(args, " "), "[]<>") {
				synopses++
				continue
			}
			text := strings.Join(tokens[i-len(args)-n:i], " ")
			if tool == "make lab" {
				var labArgs, stray []string
				for _, a := range args {
					name, value, ok := strings.Cut(a, "=")
					if !ok || !makeVars[name] {
						stray = append(stray, a)
						continue
					}
					labArgs = append(labArgs, shellFields(value)...)
				}
				if len(stray) > 0 {
					problems = append(problems, fmt.Sprintf("%s: %q: `make lab` passes %s to nothing (the Makefile's lab recipe runs the lab with %s)", where, text, strings.Join(stray, " "), varList(makeVars)))
				}
				tool, args = "dedup-lab", labArgs
			}
			cmds = append(cmds, commandLine{where: where, tool: tool, inline: q.inline, text: text, args: alternatives(args)})
		}
	}
	return cmds, synopses, problems
}

func varList(vars map[string]bool) string {
	if len(vars) == 0 {
		return "no flags"
	}
	var names []string
	for v := range vars {
		names = append(names, "$("+v+")")
	}
	sort.Strings(names)
	return strings.Join(names, " ")
}

// shellFields splits a command line into words: whitespace separates them,
// single and double quotes group, a # word starts a comment.
func shellFields(s string) []string {
	var (
		out   []string
		cur   strings.Builder
		in    bool // a word has started
		quote rune
	)
	for _, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		case r == '#' && !in:
			return out
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if in {
		out = append(out, cur.String())
	}
	return out
}

// alternatives expands the a|b|c values of args into every combination.
func alternatives(args []string) [][]string {
	out := [][]string{nil}
	for i, a := range args {
		choices := []string{a}
		if i > 0 && strings.Contains(a, "|") && !strings.HasPrefix(a, "-") {
			choices = strings.Split(a, "|")
		}
		var next [][]string
		for _, prefix := range out {
			for _, c := range choices {
				next = append(next, append(append([]string(nil), prefix...), c))
			}
		}
		out = next
	}
	return out
}

var makeVarRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// labMakeVars returns the Makefile variables the lab recipe puts after
// ./dev/lab: what `make lab NAME=...` passes to the lab.
func labMakeVars(t *testing.T, root string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]bool{}
	found, inLab := false, false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "lab:"):
			found, inLab = true, true
		case inLab && strings.HasPrefix(line, "\t"):
			if _, after, ok := strings.Cut(line, "./dev/lab"); ok {
				for _, sm := range makeVarRef.FindAllStringSubmatch(after, -1) {
					vars[sm[1]] = true
				}
			}
		default:
			inLab = false
		}
	}
	if !found {
		t.Fatal("the Makefile has no lab target")
	}
	return vars
}

// labFlag is one flag of the lab's usage.
type labFlag struct {
	name, kind string // kind: "" for a boolean
	usage      string
}

// usageFlagLine is a flag's first line in PrintDefaults: "  -name kind",
// or "  -v\tusage" for a one-letter boolean.
var usageFlagLine = regexp.MustCompile(`^  -([^ \t]+)(?: ([^ \t]+))?(?:\t(.*))?$`)

// parseUsage reads the flags out of a flag.FlagSet's PrintDefaults.
func parseUsage(usage string) []labFlag {
	var out []labFlag
	for _, line := range strings.Split(usage, "\n") {
		if sm := usageFlagLine.FindStringSubmatch(line); sm != nil {
			out = append(out, labFlag{name: sm[1], kind: sm[2], usage: sm[3]})
			continue
		}
		if n := len(out); n > 0 && strings.HasPrefix(line, "    \t") {
			out[n-1].usage += " " + strings.TrimSpace(line)
		}
	}
	return out
}

type commandResult struct {
	problems                                 []string
	labLines, labRuns, labFlags              int
	ctlLines, ctlFlags, synopses, tableFlags int
}

// checkCommandLines checks the quoted command lines of docs with the
// checkers, and the lab's flag table in tableFile.
func checkCommandLines(t *testing.T, c flagCheckers, docs []*markdown, makeVars map[string]bool, tableFile string) commandResult {
	t.Helper()
	var res commandResult
	type run struct {
		cmd  commandLine
		args []string
	}
	var labRuns, ctlRuns []run
	for _, m := range docs {
		cmds, synopses, problems := quotedCommands(m, makeVars)
		res.synopses += synopses
		res.problems = append(res.problems, problems...)
		for _, cmd := range cmds {
			flags := 0
			for _, a := range cmd.args[0] {
				if strings.HasPrefix(a, "-") {
					flags++
				}
			}
			if cmd.tool == "dedup-lab" {
				res.labLines++
				res.labFlags += flags
				for _, args := range cmd.args {
					labRuns = append(labRuns, run{cmd, args})
				}
				continue
			}
			res.ctlLines++
			res.ctlFlags += flags
			for _, args := range cmd.args {
				if cmd.inline {
					// A code span names a command and its flags, often
					// without the KEY: -h stops before the arguments.
					args = append(args, "-h")
				}
				ctlRuns = append(ctlRuns, run{cmd, args})
			}
		}
	}
	res.labRuns = len(labRuns)

	var labOut struct {
		Usage   string
		Refused []string
	}
	var lines [][]string
	for _, r := range labRuns {
		lines = append(lines, r.args)
	}
	c.ask(t, c.lab, lines, &labOut)
	for i, msg := range labOut.Refused {
		if msg != "" {
			r := labRuns[i]
			res.problems = append(res.problems, fmt.Sprintf("%s: %q: dedup-lab %s: %s", r.cmd.where, r.cmd.text, strings.Join(r.args, " "), msg))
		}
	}
	lines = nil
	for _, r := range ctlRuns {
		lines = append(lines, r.args)
	}
	var ctlOut struct{ Refused []string }
	c.ask(t, c.ctl, lines, &ctlOut)
	for i, msg := range ctlOut.Refused {
		if msg != "" {
			r := ctlRuns[i]
			res.problems = append(res.problems, fmt.Sprintf("%s: %q: dedupctl %s: %s", r.cmd.where, r.cmd.text, strings.Join(r.args, " "), msg))
		}
	}

	for _, m := range docs {
		if m.path == tableFile {
			n, problems := checkFlagTable(t, c, m, parseUsage(labOut.Usage))
			res.tableFlags = n
			res.problems = append(res.problems, problems...)
		}
	}
	sort.Strings(res.problems)
	return res
}

var (
	flagsHeading = regexp.MustCompile(`^#+\s+Flags\s*$`)
	usageWord    = regexp.MustCompile(`[A-Za-z][A-Za-z0-9-]*`)
)

// checkFlagTable checks the code block under the "Flags" heading of m, the
// lab's flag table: "-name value" pairs (a|b for the values of a flag that
// takes one of a set) and prose. Every flag of the lab appears; every value
// is accepted; a flag that takes one of a set lists the whole set: the
// words of its usage text that parseFlags accepts, when it refuses some.
func checkFlagTable(t *testing.T, c flagCheckers, m *markdown, flags []labFlag) (int, []string) {
	t.Helper()
	heading := 0
	for i, line := range m.prose {
		if flagsHeading.MatchString(line) {
			heading = i + 1
		}
	}
	var table *fence
	for i := range m.blocks {
		if heading > 0 && m.blocks[i].line > heading {
			table = &m.blocks[i]
			break
		}
	}
	if table == nil {
		return 0, []string{m.path + ": no code block under a Flags heading: the lab's flag table"}
	}
	byName := map[string]labFlag{}
	for _, f := range flags {
		byName[f.name] = f
	}
	if len(byName) == 0 {
		t.Fatal("the lab's usage lists no flag")
	}

	// The sets: for each string flag, the words of its usage that the lab
	// accepts, when it refuses some of them.
	type probe struct{ flag, word string }
	var probes []probe
	var lines [][]string
	for _, f := range flags {
		if f.kind != "string" {
			continue
		}
		for _, w := range usageWord.FindAllString(f.usage, -1) {
			probes = append(probes, probe{f.name, w})
			lines = append(lines, []string{"-" + f.name, w})
		}
	}
	var out struct{ Refused []string }
	c.ask(t, c.lab, lines, &out)
	accepted, refusedSome := map[string]map[string]bool{}, map[string]bool{}
	for i, p := range probes {
		if accepted[p.flag] == nil {
			accepted[p.flag] = map[string]bool{}
		}
		if out.Refused[i] == "" {
			accepted[p.flag][p.word] = true
		} else {
			refusedSome[p.flag] = true
		}
	}

	var problems []string
	listed := map[string]bool{}
	var pairs [][]string
	var pairLines []int
	for n, line := range strings.Split(table.code, "\n") {
		where := m.where(table.line + 1 + n)
		tokens := strings.Fields(line)
		for i := 0; i < len(tokens); i++ {
			name, ok := strings.CutPrefix(tokens[i], "-")
			if !ok || name == "" {
				continue
			}
			f, known := byName[name]
			if !known {
				problems = append(problems, fmt.Sprintf("%s: the flag table lists -%s, which the lab does not have", where, name))
				continue
			}
			listed[name] = true
			if f.kind == "" || i+1 >= len(tokens) {
				continue
			}
			i++
			value := tokens[i]
			if strings.HasPrefix(value, "$") {
				continue // the environment variable it defaults to
			}
			values := strings.Split(value, "|")
			for _, v := range values {
				pairs = append(pairs, []string{"-" + name, v})
				pairLines = append(pairLines, table.line+1+n)
			}
			if refusedSome[name] {
				var missing []string
				for v := range accepted[name] {
					if !slices.Contains(values, v) {
						missing = append(missing, v)
					}
				}
				sort.Strings(missing)
				if len(missing) > 0 {
					problems = append(problems, fmt.Sprintf("%s: the flag table lists -%s %s without %s", where, name, value, strings.Join(missing, ", ")))
				}
			}
		}
	}
	for _, f := range flags {
		if !listed[f.name] {
			problems = append(problems, fmt.Sprintf("%s: the flag table does not list -%s", m.where(table.line), f.name))
		}
	}
	var pairsOut struct{ Refused []string }
	c.ask(t, c.lab, pairs, &pairsOut)
	for i, msg := range pairsOut.Refused {
		if msg != "" {
			problems = append(problems, fmt.Sprintf("%s: the flag table's %s: %s", m.where(pairLines[i]), strings.Join(pairs[i], " "), msg))
		}
	}
	return len(listed), problems
}

// The command-line checker fails on broken input, naming file and line:
// an unknown flag, value, combination or command, `make lab` with a flag,
// and a flag table that misses flags or values or lists a wrong one.
func TestCommandLineCheckerFails(t *testing.T) {
	const page = "# Lab\n" + // 1
		"\n" + // 2
		"```sh\n" + // 3
		"go run ./dev/lab -broker rabbit          # unknown broker\n" + // 4
		"go run ./dev/lab -idempotency maybe -store redis\n" + // 5
		"go run ./dev/lab -runtime lambda -broker kafka\n" + // 6: not together
		"go run ./dev/lab -nosuch 3\n" + // 7
		"AWS_REGION=x go run ./dev/lab -broker sqs \\\n" + // 8: fine
		"  -store dynamo\n" + // 9
		"make lab -broker kafka\n" + // 10: make's flag, not the lab's
		"make lab LABFLAGS='-copies ten'\n" + // 11
		"go run ./dev/lab -v | tee out.txt && go run ./dev/lab -h\n" + // 12: fine
		"```\n" + // 13
		"\n" + // 14
		"Also `go run ./dev/lab -broker sqs|sns -store redis|mongo` and `dedupctl inspect -nosuch`.\n" + // 15
		"\n" + // 16
		"```\n" + // 17
		"$ dedupctl -store mongo list\n" + // 18
		"dedupctl output that is not a command\n" + // 19
		"$ dedupctl frobnicate KEY\n" + // 20
		"$ dedupctl list -limit 5000\n" + // 21
		"$ dedupctl [flags] inspect KEY\n" + // 22: a synopsis
		"$ dedupctl -store dynamo -json inspect -scope charge-orders ORDER-003\n" + // 23: fine
		"```\n" + // 24
		"\n" + // 25
		"## Flags\n" + // 26
		"\n" + // 27
		"```\n" + // 28
		"-broker gochannel|kafka   -store memory|redis|mongo\n" + // 29
		"-idempotency on|off|both|shadow     -copies 10\n" + // 30
		"-v   logs        -frobnicate 1\n" + // 31
		"```\n"
	m, problems := parseMarkdown("lab.md", page)
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	res := checkCommandLines(t, buildFlagCheckers(t, repoRoot(t)), []*markdown{m}, map[string]bool{"LABFLAGS": true}, "lab.md")
	all := strings.Join(res.problems, "\n")
	for _, want := range []string{
		`lab.md:4: "go run ./dev/lab -broker rabbit": dedup-lab -broker rabbit: unknown -broker "rabbit"`,
		`lab.md:5: "go run ./dev/lab -idempotency maybe -store redis": dedup-lab -idempotency maybe -store redis: -idempotency must be`,
		`lab.md:6: "go run ./dev/lab -runtime lambda -broker kafka": dedup-lab -runtime lambda -broker kafka: -runtime lambda`,
		`lab.md:7: "go run ./dev/lab -nosuch 3": dedup-lab -nosuch 3: flag provided but not defined: -nosuch`,
		"lab.md:10: \"make lab -broker kafka\": `make lab` passes -broker kafka to nothing",
		`lab.md:11: "make lab LABFLAGS=-copies ten": dedup-lab -copies ten: invalid value "ten"`,
		`lab.md:15: "go run ./dev/lab -broker sqs|sns -store redis|mongo": dedup-lab -broker sqs -store mongo: unknown -store "mongo"`,
		`lab.md:15: "go run ./dev/lab -broker sqs|sns -store redis|mongo": dedup-lab -broker sns -store mongo: unknown -store "mongo"`,
		`lab.md:15: "dedupctl inspect -nosuch": dedupctl inspect -nosuch -h: exit status 2: flag provided but not defined: -nosuch`,
		`lab.md:18: "dedupctl -store mongo list": dedupctl -store mongo list: exit status 2: dedupctl: unknown -store "mongo"`,
		`lab.md:20: "dedupctl frobnicate KEY": dedupctl frobnicate KEY: exit status 2: dedupctl: unknown command "frobnicate"`,
		`lab.md:21: "dedupctl list -limit 5000": dedupctl list -limit 5000: exit status 2`,
		"lab.md:29: the flag table lists -broker gochannel|kafka without amqp, nats, redisstream, sns, sqs",
		"lab.md:29: the flag table lists -store memory|redis|mongo without dynamo",
		`lab.md:29: the flag table's -store mongo: unknown -store "mongo"`,
		"lab.md:31: the flag table lists -frobnicate, which the lab does not have",
		"lab.md:28: the flag table does not list -runtime",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("the checker did not report %q; it reported:\n%s", want, all)
		}
	}
	if res.labLines != 10 || res.ctlLines != 5 || res.synopses != 1 {
		t.Errorf("%d lab lines, %d dedupctl lines, %d synopses; want 10, 5, 1:\n%s", res.labLines, res.ctlLines, res.synopses, all)
	}
	for _, p := range res.problems {
		for _, fine := range []string{"lab.md:8:", "lab.md:12:", "lab.md:19:", "lab.md:22:", "lab.md:23:"} {
			if strings.HasPrefix(p, fine) {
				t.Errorf("a good line was reported: %s", p)
			}
		}
	}
}
