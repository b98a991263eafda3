// Package docs_test checks the repository's Markdown against the code:
//
//   - every ```go block of every Markdown file compiles as pasted
//     (goblocks_test.go): a complete file as it is, a fragment inside a
//     harness that declares only the names the text says come from
//     elsewhere; the root README's Quick start is examples/quickstart/main.go
//     verbatim, built and run here against a redis-server of its own, and
//     its Engine.Do block is ExampleEngine_Do's body;
//   - relative links and #anchors resolve (links_test.go);
//   - the dedup-lab and dedupctl command lines quoted in Markdown, and the
//     lab's flag table, pass the commands' own flag parsing (flags_test.go).
//
// docs/dev/docs-tests.md lists every check and says what to do when one of
// them fails.
package docs_test

import (
	"bytes"
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

// readmeBlocks returns the ```go blocks of the root README.md.
func readmeBlocks(t *testing.T, root string) []fence {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m, problems := parseMarkdown("README.md", string(b))
	for _, p := range problems {
		t.Error(p)
	}
	return m.goBlocks()
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := testserver.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func goTool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	return path
}

// runGo runs the go command in the repository root, bounded, and fails the
// test when it fails.
func runGo(t *testing.T, root string, args ...string) string {
	t.Helper()
	out, err := goCommand(t, root, args...)
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

const quickstartFile = "examples/quickstart/main.go"

// The README's Quick start block is examples/quickstart/main.go, byte for
// byte, so what a reader pastes is what `make test` builds and runs.
func TestReadmeQuickStartIsTheProgram(t *testing.T) {
	root := repoRoot(t)
	blocks := readmeBlocks(t, root)
	if len(blocks) == 0 {
		t.Fatal("README.md has no go block")
	}
	want, err := os.ReadFile(filepath.Join(root, quickstartFile))
	if err != nil {
		t.Fatal(err)
	}
	if blocks[0].code != string(want) {
		t.Fatalf("README.md's first go block (line %d, the Quick start) differs from %s: copy the file into the README", blocks[0].line, quickstartFile)
	}
}

// The Quick start program charges ORDER-003 once for ten copies, sends the
// message without a key to the poison topic once (one key_missing error
// line, no nack loop), leaves exactly the key it says it leaves
// (dedup:charge-orders:ORDER-003, for 24 hours), and a second run within
// that time charges nothing: what the README shows, stdout and stderr.
func TestQuickStartRuns(t *testing.T) {
	root := repoRoot(t)
	r, err := testserver.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	bin := filepath.Join(t.TempDir(), "quickstart")
	runGo(t, root, "build", "-o", bin, "./examples/quickstart")
	run := func() (stdout, stderr string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin)
		cmd.Env = append(os.Environ(), "REDIS_ADDR="+r.Addr)
		var errBuf bytes.Buffer
		cmd.Stderr = &errBuf
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("quickstart: %v\n%s", err, errBuf.String())
		}
		return string(out), errBuf.String()
	}
	first, firstLog := run()
	second, _ := run()
	const once = "10 copies of ORDER-003, 1 charge(s); 1 message(s) without a key on orders.poison\n"
	const none = "10 copies of ORDER-003, 0 charge(s); 1 message(s) without a key on orders.poison\n"
	if first != once || second != none {
		t.Fatalf("quickstart printed %q, then %q; want %q, then %q", first, second, once, none)
	}
	// stderr: nine duplicates skipped, one error line (the message without
	// a key), and no handler error from the router: the poison queue took it.
	var errorLines []string
	for _, line := range strings.Split(firstLog, "\n") {
		if strings.Contains(line, "level=ERROR") {
			errorLines = append(errorLines, line)
		}
	}
	if n := strings.Count(firstLog, "dedup: skip_duplicate"); n != 9 {
		t.Errorf("the first run logged %d skip_duplicate lines, want 9:\n%s", n, firstLog)
	}
	if len(errorLines) != 1 || !strings.Contains(errorLines[0], `msg="dedup: key_missing"`) ||
		!strings.Contains(errorLines[0], "no usable business key at json:order_id: missing") {
		t.Errorf("the first run logged these ERROR lines, want one key_missing line:\n%s", strings.Join(errorLines, "\n"))
	}

	client := goredis.NewClient(&goredis.Options{Addr: r.Addr})
	defer client.Close()
	ctx := context.Background()
	keys, err := client.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(keys) != "[dedup:charge-orders:ORDER-003]" {
		t.Fatalf("the quickstart left the keys %q, want only dedup:charge-orders:ORDER-003", keys)
	}
	if ttl := client.PTTL(ctx, keys[0]).Val(); ttl <= 23*time.Hour || ttl > 24*time.Hour {
		t.Fatalf("dedup:charge-orders:ORDER-003 expires in %v, want the 24h retention", ttl)
	}

	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		strings.TrimSpace(once), strings.TrimSpace(none), "`dedup:charge-orders:ORDER-003`",
		"$ grep -c 'dedup: skip_duplicate' quickstart.log\n9\n",
		`level=ERROR msg="dedup: key_missing" dedup_event=key_missing err="dedup: no usable business key at json:order_id: missing (message `,
	} {
		if !bytes.Contains(readme, []byte(want)) {
			t.Errorf("README.md does not show %q", want)
		}
	}
}

// functionBody returns the statements of the function name in file,
// without the body's braces and its first level of indentation, and
// without the trailing // Output: comment.
func functionBody(t *testing.T, file, name string) string {
	t.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Name.Name != name {
			continue
		}
		body := string(src[fset.Position(fn.Body.Lbrace).Offset+2 : fset.Position(fn.Body.Rbrace).Offset])
		body, _, _ = strings.Cut(body, "\t// Output:")
		var out strings.Builder
		for _, line := range strings.SplitAfter(body, "\n") {
			out.WriteString(strings.TrimPrefix(line, "\t"))
		}
		return out.String()
	}
	t.Fatalf("%s has no function %s", file, name)
	return ""
}
