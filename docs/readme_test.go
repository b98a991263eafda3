// Package docs_test checks that the Go code in the repository's README
// compiles as pasted: the Quick start is examples/quickstart/main.go
// verbatim (built and run here against a redis-server of its own), the
// Engine.Do snippet is ExampleEngine_Do's body, and every other Go block is
// type-checked inside a harness that declares only the names the text says
// come from elsewhere (your router, your store, your handler).
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

	"github.com/watermill-dedup/watermill-dedup/internal/testserver"
)

// goBlock is one ```go block of a Markdown file.
type goBlock struct {
	line int // of the opening fence
	code string
}

func readmeBlocks(t *testing.T, root string) []goBlock {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var (
		blocks []goBlock
		cur    *goBlock
	)
	for i, line := range strings.SplitAfter(string(b), "\n") {
		switch {
		case cur == nil && strings.TrimSpace(line) == "```go":
			cur = &goBlock{line: i + 1}
		case cur != nil && strings.TrimSpace(line) == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.code += line
		}
	}
	if cur != nil {
		t.Fatalf("README.md: the go block at line %d is not closed", cur.line)
	}
	return blocks
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

// runGo runs the go command in the repository root, bounded.
func runGo(t *testing.T, root string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool(t), args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
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

// The Quick start program charges ORDER-003 once for ten copies, leaves
// exactly the key it says it leaves (dedup:charge-orders:ORDER-003, for 24
// hours), and a second run within that time charges nothing: what the
// README shows.
func TestQuickStartRuns(t *testing.T) {
	root := repoRoot(t)
	r, err := testserver.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	bin := filepath.Join(t.TempDir(), "quickstart")
	runGo(t, root, "build", "-o", bin, "./examples/quickstart")
	run := func() string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin)
		cmd.Env = append(os.Environ(), "REDIS_ADDR="+r.Addr)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("quickstart: %v\n%s", err, stderr.String())
		}
		return string(out)
	}
	first, second := run(), run()
	const once, none = "10 copies of ORDER-003, 1 charge(s)\n", "10 copies of ORDER-003, 0 charge(s)\n"
	if first != once || second != none {
		t.Fatalf("quickstart printed %q, then %q; want %q, then %q", first, second, once, none)
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
	for _, want := range []string{strings.TrimSpace(once), strings.TrimSpace(none), "`dedup:charge-orders:ORDER-003`"} {
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

// harness turns a README fragment into a Go file of package snippets. The
// fragment runs inside a function whose parameters are the names the
// README takes from the reader's program; after is appended (to use what
// the fragment declares but does not use).
type harness struct {
	imports  []string
	params   string
	after    string
	topLevel bool // the fragment is a declaration, not statements
	decls    string
}

// harnesses, by the first line of each README fragment.
var harnesses = map[string]harness{
	"poison, _ := middleware.PoisonQueueWithFilter(publisher, \"orders.poison\", dedup.IsPermanent)": {
		imports: []string{"time", "github.com/ThreeDotsLabs/watermill/message", "github.com/ThreeDotsLabs/watermill/message/router/middleware", "github.com/watermill-dedup/watermill-dedup/dedup"},
		params:  "publisher message.Publisher, router *message.Router, d *dedup.Deduplicator",
	},
	"func TestConformance(t *testing.T) {": {
		imports:  []string{"testing", "time", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/dedup/storetest"},
		topLevel: true,
		decls:    "var newStoreForTest func(t *testing.T) dedup.Store",
	},
	"router.AddMiddleware(d.Middleware, store.TxMiddleware) // the first added is the outermost": {
		imports: []string{"github.com/ThreeDotsLabs/watermill/message", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/stores/postgres"},
		params:  "router *message.Router, d *dedup.Deduplicator, store *postgres.Store, sub message.Subscriber, parseOrder func(*message.Message) struct{ ID string; Amount int }",
	},
	"idem, err := httpdedup.New(httpdedup.Config{": {
		imports: []string{"net/http", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/httpdedup"},
		params:  "store dedup.Store, accountOf func(*http.Request) (string, error), mux *http.ServeMux, authenticate func(http.Handler) http.Handler, createPayment http.Handler",
		after:   "_ = err",
	},
	"h, err := lambdadedup.New(lambdadedup.Config{": {
		imports: []string{"log", "github.com/ThreeDotsLabs/watermill/message", "github.com/aws/aws-lambda-go/lambda", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/keyfuncs", "github.com/watermill-dedup/watermill-dedup/lambdadedup"},
		params:  "store dedup.Store, chargeOrder func(*message.Message) error",
	},
	"d, err := dedup.New(dedup.Config{": { // InProgressWait
		imports: []string{"time", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/keyfuncs"},
		params:  "store dedup.Store",
		after:   "_, _ = d, err",
	},
	"router, err := message.NewRouter(message.RouterConfig{}, dedup.InProgressAtInfo(logger))": {
		imports: []string{"github.com/ThreeDotsLabs/watermill", "github.com/ThreeDotsLabs/watermill/message", "github.com/watermill-dedup/watermill-dedup/dedup"},
		params:  "logger watermill.LoggerAdapter",
		after:   "_, _ = router, err",
	},
	"tracer := oteldedup.New(oteldedup.Config{TracerProvider: provider}) // default: otel.GetTracerProvider()": {
		imports: []string{"github.com/ThreeDotsLabs/watermill/message", "go.opentelemetry.io/otel/trace", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/keyfuncs", "github.com/watermill-dedup/watermill-dedup/oteldedup"},
		params:  "store dedup.Store, provider trace.TracerProvider, router *message.Router",
		after:   "_ = err",
	},
	"obs, err := metrics.New(prometheus.DefaultRegisterer, metrics.Config{})": {
		imports: []string{"github.com/ThreeDotsLabs/watermill/message", "github.com/prometheus/client_golang/prometheus", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/metrics"},
		params:  "store dedup.Store, key func(*message.Message) (string, error)",
		after:   "_, _ = d, err",
	},
}

// Every Go block of the README compiles: the Quick start is the program
// (TestReadmeQuickStartIsTheProgram), the Engine.Do block is
// ExampleEngine_Do's body (run with its // Output: by `go test ./dedup`),
// (the README shows its first statements), and the fragments compile inside their harnesses. A new block without a
// harness fails here, so it gets one.
func TestReadmeGoBlocksCompile(t *testing.T) {
	root := repoRoot(t)
	blocks := readmeBlocks(t, root)
	engineDo := functionBody(t, filepath.Join(root, "dedup", "example_test.go"), "ExampleEngine_Do")

	if err := os.MkdirAll(filepath.Join(root, "docs", "testdata"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(filepath.Join(root, "docs", "testdata"), "snippets-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = os.RemoveAll(dir)
		_ = os.Remove(filepath.Dir(dir)) // docs/testdata, unless another run uses it
	})
	used := map[string]bool{}
	for i, b := range blocks {
		first, _, _ := strings.Cut(b.code, "\n")
		switch {
		case i == 0:
			continue // the Quick start: TestReadmeQuickStartIsTheProgram
		case strings.HasPrefix(engineDo, b.code) && strings.HasSuffix(b.code, "}\n"):
			continue // its first statements, up to a closing brace
		case strings.HasPrefix(first, "engine, err := dedup.NewEngine("):
			t.Errorf("README.md line %d: the Engine.Do block is not the beginning of ExampleEngine_Do's body in dedup/example_test.go:\n%s\nwant the beginning of\n%s", b.line, b.code, engineDo)
			continue
		}
		h, ok := harnesses[first]
		if !ok {
			t.Errorf("README.md line %d: a go block starting %q has no harness in docs/readme_test.go", b.line, first)
			continue
		}
		used[first] = true
		var src strings.Builder
		src.WriteString("package snippets\n\nimport (\n")
		for _, imp := range h.imports {
			fmt.Fprintf(&src, "\t%q\n", imp)
		}
		src.WriteString(")\n\n")
		if h.decls != "" {
			src.WriteString(h.decls + "\n\n")
		}
		fmt.Fprintf(&src, "// README.md line %d\n", b.line)
		if h.topLevel {
			src.WriteString(b.code)
		} else {
			fmt.Fprintf(&src, "func snippet%d(%s) {\n%s%s\n}\n", b.line, h.params, b.code, h.after)
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("readme_line_%d.go", b.line)), []byte(src.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for first := range harnesses {
		if !used[first] {
			t.Errorf("the harness for %q matches no README block: remove it", first)
		}
	}
	rel, err := filepath.Rel(root, dir)
	if err != nil {
		t.Fatal(err)
	}
	runGo(t, root, "vet", "./"+filepath.ToSlash(rel))
}
