package docs_test

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
)

// blockKey names a ```go block: its Markdown file and its beginning (after
// the block's own import declaration, if it has one): its first line, or
// more where two blocks of a file start alike.
type blockKey struct{ file, first string }

// harness completes a Markdown fragment into a Go package that `go vet`
// type-checks. It declares only what the surrounding text says comes from
// elsewhere (your router, your store, your handler) and the imports a
// fragment without an import declaration of its own takes for granted.
//
// A fragment of statements runs in a function; a declaration fragment
// (topLevel) is the file's top level. The names are package-level
// variables of a file of their own, so a fragment that brings its own
// imports gets exactly those: a package it uses without importing it is
// reported.
type harness struct {
	// imports are import paths, "alias path" where the package name is not
	// the path's last element. Each file gets those it refers to.
	imports []string
	// names declares the names from elsewhere, one "name Type" per line.
	// Each must appear in the fragment.
	names string
	// results is the result list of the function a statement fragment
	// runs in ("error" for one that returns err).
	results string
	// after is appended to a statement fragment, to use what it declares
	// and leaves unused.
	after    string
	topLevel bool
}

// harnesses, by file and first line of each fragment. A new fragment without
// a harness fails TestGoBlocksCompile, so it gets one; a harness that
// matches no block fails it too.
var harnesses = map[blockKey]harness{
	// docs/router.md: the wiring of the Quick start, as a fragment.
	{"docs/router.md", "poison, err := middleware.PoisonQueueWithFilter(publisher, \"orders.poison\", dedup.IsPermanent)"}: {
		imports: []string{"time", "github.com/ThreeDotsLabs/watermill", "github.com/ThreeDotsLabs/watermill/message", "github.com/ThreeDotsLabs/watermill/message/router/middleware", "github.com/watermill-dedup/watermill-dedup/dedup"},
		names:   "publisher message.Publisher\nsubscriber message.Subscriber\nlogger watermill.LoggerAdapter\nrouter *message.Router\nd *dedup.Deduplicator\nchargeOrder, readPoison func(*message.Message) error",
		results: "error",
		after:   "return nil",
	},
	// docs/dev/conformance.md
	{"docs/dev/conformance.md", "func TestConformance(t *testing.T) {"}: {
		imports:  []string{"testing", "time", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/dedup/storetest"},
		topLevel: true,
		names:    "newStoreForTest func(t *testing.T) dedup.Store",
	},
	// docs/keys.md
	{"docs/keys.md", "d, err := dedup.New(dedup.Config{"}: {
		imports: []string{"github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/keyfuncs"},
		names:   "store dedup.Store",
		after:   "_, _ = d, err",
	},
	// docs/redis.md
	{"docs/redis.md", "client := redis.NewUniversalClient(&redis.UniversalOptions{"}: {
		imports: []string{"context", "github.com/redis/go-redis/v9", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/keyfuncs", "dedupredis github.com/watermill-dedup/watermill-dedup/stores/redis"},
		names:   "ctx context.Context",
		results: "error",
		after:   "_, _ = d, err\nreturn nil",
	},
	{"docs/redis.md", "store, err := dedupredis.New(ctx, dedupredis.Config{\n\tClient:       client,"}: {
		imports: []string{"context", "time", "github.com/redis/go-redis/v9", "dedupredis github.com/watermill-dedup/watermill-dedup/stores/redis"},
		names:   "ctx context.Context\nclient redis.UniversalClient",
		after:   "_, _ = store, err",
	},
	// docs/dynamodb.md: the fragment takes its imports from the page's import block.
	{"docs/dynamodb.md", "awsConfig, err := config.LoadDefaultConfig(ctx)"}: {
		imports: []string{"context"},
		names:   "ctx context.Context",
		results: "error",
		after:   "_, _ = d, err\nreturn nil",
	},
	// docs/postgres.md
	{"docs/postgres.md", "store, err := postgres.New(ctx, postgres.Config{DB: pool})"}: {
		imports: []string{"context", "github.com/ThreeDotsLabs/watermill/message", "github.com/jackc/pgx/v5/pgxpool", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/keyfuncs", "github.com/watermill-dedup/watermill-dedup/stores/postgres"},
		names:   "pool *pgxpool.Pool\nctx context.Context\nrouter *message.Router\nsubscriber message.Subscriber\norderOf func(*message.Message) (string, int)",
		results: "error",
		after:   "return nil",
	},
	// docs/http.md
	{"docs/http.md", "idem, err := httpdedup.New(httpdedup.Config{"}: {
		imports: []string{"net/http", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/httpdedup"},
		names:   "store dedup.Store\naccountOf func(*http.Request) (string, error)\nmux *http.ServeMux\nauthenticate func(http.Handler) http.Handler\ncreatePayment func(http.ResponseWriter, *http.Request)",
		results: "error",
		after:   "return nil",
	},
	// docs/lambda.md
	{"docs/lambda.md", "h, err := lambdadedup.New(lambdadedup.Config{"}: {
		imports: []string{"log", "github.com/ThreeDotsLabs/watermill/message", "github.com/aws/aws-lambda-go/lambda", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/keyfuncs", "github.com/watermill-dedup/watermill-dedup/lambdadedup"},
		names:   "store dedup.Store\nchargeOrder func(*message.Message) error",
	},
	// docs/migrating-from-powertools.md
	{"docs/migrating-from-powertools.md", "store, err := dynamo.New(ctx, dynamo.Config{"}: {
		imports: []string{"context", "log", "time", "github.com/ThreeDotsLabs/watermill/message", "github.com/aws/aws-lambda-go/lambda", "github.com/aws/aws-sdk-go-v2/aws",
			"github.com/aws/aws-sdk-go-v2/service/dynamodb", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/lambdadedup",
			"github.com/watermill-dedup/watermill-dedup/lambdadedup/powertools", "github.com/watermill-dedup/watermill-dedup/stores/dynamo"},
		names: "ctx context.Context\nawsConfig aws.Config\nchargeOrder func(*message.Message) error",
	},
	// docs/operations.md
	{"docs/operations.md", "obs, err := metrics.New(prometheus.DefaultRegisterer, metrics.Config{})"}: {
		imports: []string{"github.com/ThreeDotsLabs/watermill/message", "github.com/prometheus/client_golang/prometheus", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/metrics"},
		names:   "store dedup.Store\nkey func(*message.Message) (string, error)",
		after:   "_, _ = d, err",
	},
	// docs/migrating-from-deduplicator.md: before and after.
	{"docs/migrating-from-deduplicator.md", "repository, err := middleware.NewMapExpiringKeyRepository(time.Hour)"}: {
		imports: []string{"time", "github.com/ThreeDotsLabs/watermill/message", "github.com/ThreeDotsLabs/watermill/message/router/middleware"},
		names:   "router *message.Router",
		results: "error",
		after:   "return nil",
	},
	// The after block is also part of examples/migrating/main.go
	// (TestMigrationGuideIsTheExample), which runs with its poison queue.
	{"docs/migrating-from-deduplicator.md", "d, err := dedup.New(dedup.Config{"}: {
		imports: []string{"time", "github.com/ThreeDotsLabs/watermill", "github.com/ThreeDotsLabs/watermill/message", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/keyfuncs"},
		names:   "store dedup.Store\nlogger watermill.LoggerAdapter\nshadow bool\nrouter *message.Router\nsubscriber message.Subscriber\nchargeOrder, readPoison func(*message.Message) error",
		results: "error",
		after:   "return nil",
	},

	// docs/batches.md
	{"docs/batches.md", "calls := make([]dedup.BatchCall, len(orderIDs))"}: {
		imports: []string{"context", "github.com/watermill-dedup/watermill-dedup/dedup"},
		names:   "engine *dedup.Engine\nctx context.Context\norderIDs []string\ncharge func(context.Context, string) error\nretryLater func(string)",
	},
	{"docs/batches.md", "func TestBatchConformance(t *testing.T) {"}: {
		imports:  []string{"testing", "github.com/watermill-dedup/watermill-dedup/dedup/storetest"},
		topLevel: true,
		names:    "newStore storetest.Constructor",
	},

	// docs/fencing.md
	{"docs/fencing.md", "fence, ok := dedup.FenceFromContext(msg.Context())"}: {
		imports: []string{"errors", "github.com/ThreeDotsLabs/watermill/message", "github.com/watermill-dedup/watermill-dedup/dedup"},
		names:   "msg *message.Message",
		results: "error",
		after:   "_ = fence\nreturn nil",
	},
	{"docs/fencing.md", "var errStale = fmt.Errorf(\"a later claim has written: %w\", dedup.ErrClaimLost)"}: {
		imports:  []string{"errors", "fmt", "github.com/ThreeDotsLabs/watermill/message", "github.com/jackc/pgx/v5/pgxpool", "github.com/watermill-dedup/watermill-dedup/dedup"},
		topLevel: true,
		names:    "db *pgxpool.Pool\norderOf func(*message.Message) (string, int)",
	},
	{"docs/fencing.md", "req, err := http.NewRequestWithContext(ctx, http.MethodPost, shippingURL, body)"}: {
		imports: []string{"context", "fmt", "io", "net/http", "strconv"},
		names:   "ctx context.Context\nshippingURL string\nbody io.Reader\norderID string\nfence uint64\nerrStale error",
		results: "error",
		after:   "return nil",
	},
	{"docs/fencing.md", "cond := expression.Or("}: {
		imports: []string{"context", "errors", "fmt", "strconv", "github.com/aws/aws-sdk-go-v2/aws", "github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression", "github.com/aws/aws-sdk-go-v2/service/dynamodb", "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"},
		names:   "ctx context.Context\nclient *dynamodb.Client\norderID string\namount int\nfence uint64\nerrStale error",
		results: "error",
	},

	// docs/custom-store.md
	{"docs/custom-store.md", "// runInTx is a store's RunInTx: the shared sequence with the store's own"}: {
		imports:  []string{"context", "time", "github.com/ThreeDotsLabs/watermill/message", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/dedup/storekit"},
		topLevel: true,
		names:    "begin func(ctx context.Context, claim *dedup.Claim) (context.Context, storekit.Tx, error)",
	},
	{"docs/custom-store.md", "func TestConformance(t *testing.T) {"}: {
		imports:  []string{"testing", "time", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/dedup/storetest"},
		topLevel: true,
		names:    "newStoreForTest func(t *testing.T) dedup.Store",
	},

	// cmd/dedupctl/README.md
	{"cmd/dedupctl/README.md", "type Interface interface {"}: {
		imports:  []string{"context", "time"},
		topLevel: true,
	},
	// examples/http/README.md: the wiring, condensed from app.go.
	{"examples/http/README.md", "store, _ := dedupredis.New(ctx, dedupredis.Config{Client: client, KeyPrefix: \"example:\"})"}: {
		imports: []string{"context", "net/http", "github.com/ThreeDotsLabs/watermill/message", "github.com/redis/go-redis/v9", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/httpdedup", "github.com/watermill-dedup/watermill-dedup/keyfuncs", "dedupredis github.com/watermill-dedup/watermill-dedup/stores/redis"},
		names:   "ctx context.Context\nclient redis.UniversalClient\nmux *http.ServeMux\nrouter *message.Router\npubSub message.Subscriber\naccountIdentity func(*http.Request) (string, error)\nauthenticate func(http.Handler) http.Handler\na struct{ createPayment, receiveWebhook http.HandlerFunc; sendReceipt message.NoPublishHandlerFunc }",
	},
	// examples/kafka/README.md
	{"examples/kafka/README.md", "key := keyfuncs.FirstOf(keyfuncs.Metadata(\"order_id\"), keyfuncs.JSON(\"order_id\")) // dedup.Config.Key"}: {
		imports: []string{"github.com/watermill-dedup/watermill-dedup/keyfuncs"},
		after:   "_ = key",
	},
	// httpdedup/README.md
	{"httpdedup/README.md", "idem, err := httpdedup.New(httpdedup.Config{"}: {
		imports: []string{"net/http", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/httpdedup"},
		names:   "store dedup.Store\naccountOf func(*http.Request) (string, error)\nmux *http.ServeMux\nauthenticate func(http.Handler) http.Handler\ncreatePayment, createNote func(http.ResponseWriter, *http.Request)",
		results: "error",
		after:   "return nil",
	},
	{"httpdedup/README.md", "idem, err := httpdedup.New(httpdedup.Config{\n\tDedup:         dedup.Config{Store: store}, // *postgres.Store"}: {
		imports: []string{"net/http", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/httpdedup", "github.com/watermill-dedup/watermill-dedup/stores/postgres"},
		names:   "store *postgres.Store\naccountOf func(*http.Request) (string, error)\nmux *http.ServeMux\nparsePayment func(*http.Request) (id string, amount int)",
		after:   "_ = err",
	},
	{"httpdedup/README.md", "hooks, err := httpdedup.New(httpdedup.Config{"}: {
		imports: []string{"net/http", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/httpdedup", "github.com/watermill-dedup/watermill-dedup/keyfuncs"},
		names:   "store dedup.Store\nmux *http.ServeMux\nverifySignature func(http.Handler) http.Handler\nhandleEvent func(http.ResponseWriter, *http.Request)",
		after:   "_ = err",
	},
	// lambdadedup/README.md
	{"lambdadedup/README.md", "h, err := lambdadedup.New(lambdadedup.Config{"}: {
		imports: []string{"log", "github.com/ThreeDotsLabs/watermill/message", "github.com/aws/aws-lambda-go/lambda", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/keyfuncs", "github.com/watermill-dedup/watermill-dedup/lambdadedup"},
		names:   "store dedup.Store\nchargeOrder func(*message.Message) error",
	},
	// stores/dynamo/README.md: the first block brings its imports.
	{"stores/dynamo/README.md", "awsConfig, err := config.LoadDefaultConfig(ctx)"}: {
		imports: []string{"context"},
		names:   "ctx context.Context",
		results: "error",
		after:   "_, _ = d, err\nreturn nil",
	},
	{"stores/dynamo/README.md", "err := dynamo.CreateTable(ctx, dynamodb.NewFromConfig(awsConfig), dynamo.TableConfig{Table: \"dedup\"})"}: {
		imports: []string{"context", "github.com/aws/aws-sdk-go-v2/aws", "github.com/aws/aws-sdk-go-v2/service/dynamodb", "github.com/watermill-dedup/watermill-dedup/stores/dynamo"},
		names:   "ctx context.Context\nawsConfig aws.Config",
		after:   "_ = err",
	},
	// stores/postgres/README.md
	{"stores/postgres/README.md", "store, err := postgres.New(ctx, postgres.Config{DB: pool}) // Table \"dedup_keys\", search_path schema"}: {
		imports: []string{"context", "net/http", "github.com/ThreeDotsLabs/watermill/message", "github.com/jackc/pgx/v5/pgxpool", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/httpdedup", "github.com/watermill-dedup/watermill-dedup/stores/postgres"},
		names:   "pool *pgxpool.Pool\nctx context.Context\nkeyfunc func(*message.Message) (string, error)\nrouter *message.Router\nsub message.Subscriber\naccountOf func(*http.Request) (string, error)\nmux *http.ServeMux",
		after:   "_, _ = n, err",
	},
	{"stores/postgres/outbox/README.md", "store, err := postgres.New(ctx, postgres.Config{DB: pool})"}: {
		imports: []string{"context", "github.com/ThreeDotsLabs/watermill/components/forwarder", "github.com/ThreeDotsLabs/watermill/message", "github.com/jackc/pgx/v5/pgxpool", "github.com/watermill-dedup/watermill-dedup/dedup", "github.com/watermill-dedup/watermill-dedup/keyfuncs", "github.com/watermill-dedup/watermill-dedup/stores/postgres", "github.com/watermill-dedup/watermill-dedup/stores/postgres/outbox"},
		names:   "pool *pgxpool.Pool\nctx context.Context\nrouter *message.Router\nkafkaSub message.Subscriber\nkafkaPub message.Publisher\norderID func(*message.Message) string\npaymentEvent func(*message.Message) *message.Message",
		after:   "_ = err",
	},
	// stores/redis/README.md: the fragments take their imports from the
	// page's import block.
	{"stores/redis/README.md", "client := redis.NewClient(&redis.Options{Addr: \"localhost:6379\"})"}: {
		imports: []string{"context"},
		names:   "ctx context.Context",
		results: "error",
		after:   "_, _ = d, err\nreturn nil",
	},
	{"stores/redis/README.md", "client := redis.NewFailoverClient(&redis.FailoverOptions{"}: {
		imports: []string{"context"},
		names:   "ctx context.Context",
		after:   "_, _ = store, err",
	},
	{"stores/redis/README.md", "client := redis.NewClusterClient(&redis.ClusterOptions{"}: {
		imports: []string{"context"},
		names:   "ctx context.Context",
		after:   "_, _ = store, err",
	},
	{"stores/redis/README.md", "store, err := dedupredis.New(ctx, dedupredis.Config{\n\tClient:       client,"}: {
		imports: []string{"context", "github.com/redis/go-redis/v9"},
		names:   "ctx context.Context\nclient redis.UniversalClient",
		after:   "_, _ = store, err",
	},
}

// Every ```go block of every Markdown file compiles as pasted: a complete
// file (package clause first) as it is, a fragment inside its harness, an
// import declaration alone as the imports of the fragments after it on the
// page. The root README's Quick start is also examples/quickstart/main.go
// (TestReadmeQuickStartIsTheProgram), and its Engine.Do block is the
// beginning of ExampleEngine_Do's body (run with its // Output: by `go
// test ./dedup`). A block marked <!-- fragment: REASON --> must only parse.
func TestGoBlocksCompile(t *testing.T) {
	root := repoRoot(t)
	docs := loadRepository(t, root).markdownFiles(t)
	engineDo := functionBody(t, filepath.Join(root, "dedup", "example_test.go"), "ExampleEngine_Do")
	special := func(m *markdown, b fence) (bool, string) {
		if m.path != "README.md" {
			return false, ""
		}
		switch {
		case strings.HasPrefix(engineDo, b.code) && strings.HasSuffix(b.code, "}\n"):
			return true, "" // its first statements, up to a closing brace
		case strings.HasPrefix(b.code, "ctx := context.Background()\nstore, err := memory.New("):
			return true, fmt.Sprintf("%s: the Engine.Do block is not the beginning of ExampleEngine_Do's body in dedup/example_test.go:\n%s\nwant the beginning of\n%s", m.where(b.line), b.code, engineDo)
		}
		return false, ""
	}
	res := checkGoBlocks(t, root, docs, harnesses, special)
	for _, p := range res.problems {
		t.Error(p)
	}
	t.Logf("%d go blocks in %d Markdown files: %d complete files, %d fragments in harnesses, %d import blocks, %d checked otherwise, %d marked fragments (parsed only)",
		res.blocks, res.files, res.programs, res.harnessed, res.importBlocks, res.special, res.marked)
}

// goBlockResult is what checkGoBlocks found.
type goBlockResult struct {
	problems                                                          []string
	files, blocks, programs, harnessed, importBlocks, special, marked int
}

// checkGoBlocks writes each ```go block of docs as a package of its own
// under docs/testdata, vets them all in one `go vet` run and returns the
// problems, each naming the Markdown file and line. special may claim a
// block (and report a problem with it) before the general rules apply.
func checkGoBlocks(t *testing.T, root string, docs []*markdown, hs map[blockKey]harness, special func(*markdown, fence) (bool, string)) goBlockResult {
	t.Helper()
	var res goBlockResult
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
	problem := func(format string, args ...any) { res.problems = append(res.problems, fmt.Sprintf(format, args...)) }
	usedHarness := map[blockKey]bool{}
	wrote := 0
	for _, m := range docs {
		blocks := m.goBlocks()
		if len(blocks) == 0 {
			continue
		}
		res.files++
		// The imports of the page's last import-only block, and which of
		// them a later fragment used.
		var page *pageImports
		checkPage := func() {
			if page == nil {
				return
			}
			for _, imp := range page.specs {
				if !page.used[imp.name] {
					problem("%s: the import block imports %s, which no go block after it uses", m.where(page.line), imp.path)
				}
			}
		}
		for _, b := range blocks {
			res.blocks++
			abs := filepath.Join(root, filepath.FromSlash(m.path))
			if ok, p := special(m, b); ok {
				res.special++
				if p != "" {
					problem("%s", p)
				}
				continue
			}
			if b.marker != "" {
				res.marked++
				if !parses(b.code) {
					problem("%s: the go block marked as a fragment does not even parse as Go declarations or statements", m.where(b.line))
				}
				continue
			}
			own, rest, restLine, err := splitImports(b.code)
			if err != nil {
				problem("%s: %v", m.where(b.line), err)
				continue
			}
			pkgDir := filepath.Join(dir, fmt.Sprintf("%s_%d", sanitize(m.path), b.line))
			var src strings.Builder
			switch {
			case isFile(b.code):
				res.programs++
				fmt.Fprintf(&src, "//line %s:%d\n%s", abs, b.line+1, b.code)
				writeFile(t, pkgDir, "block.go", src.String())
				wrote++
				continue
			case own != nil && strings.TrimSpace(rest) == "":
				res.importBlocks++
				checkPage()
				page = &pageImports{line: b.line, specs: own, used: map[string]bool{}}
				continue
			}
			key, ok := harnessFor(hs, m.path, rest)
			h := hs[key]
			if !ok {
				first, _, _ := strings.Cut(strings.TrimLeft(rest, "\n"), "\n")
				problem("%s: a go block starting %q has no harness in docs/goblocks_test.go (nor a <!-- fragment: REASON --> marker)", m.where(b.line), first)
				continue
			}
			res.harnessed++
			usedHarness[key] = true
			uses := usedPackages(rest + "\n" + h.after)
			// The block's imports: its own; else the page's; else the
			// harness's.
			var imports []importSpec
			switch {
			case own != nil:
				imports = own
			case page != nil:
				for _, imp := range page.specs {
					if uses[imp.name] {
						imports = append(imports, imp)
						page.used[imp.name] = true
					}
				}
			default:
				for _, imp := range parseSpecs(t, h.imports) {
					if uses[imp.name] {
						imports = append(imports, imp)
					}
				}
			}
			for _, name := range declaredNames(t, h.names) {
				if !mentions(rest, name) {
					problem("%s: the harness declares %s, which the go block does not use: remove it from docs/goblocks_test.go", m.where(b.line), name)
				}
			}

			src.WriteString("package snippet\n\n")
			if own != nil {
				fmt.Fprintf(&src, "//line %s:%d\n%s", abs, b.line+1, b.code[:len(b.code)-len(rest)])
			} else {
				writeImports(&src, imports)
			}
			body := fmt.Sprintf("//line %s:%d\n%s", abs, b.line+1+restLine, rest)
			if h.topLevel {
				src.WriteString(body)
			} else {
				fmt.Fprintf(&src, "func snippet() (%s) {\n%s//line harness-after:1\n%s\n}\n", h.results, body, h.after)
			}
			writeFile(t, pkgDir, "block.go", src.String())
			if h.names != "" {
				var names strings.Builder
				names.WriteString("package snippet\n\n")
				nameUses := usedPackages(h.names)
				var imps []importSpec
				for _, imp := range parseSpecs(t, h.imports) {
					if nameUses[imp.name] {
						imps = append(imps, imp)
					}
				}
				writeImports(&names, imps)
				fmt.Fprintf(&names, "var (\n%s\n)\n", h.names)
				writeFile(t, pkgDir, "names.go", names.String())
			}
			wrote++
		}
		checkPage()
	}
	for key := range hs {
		if !usedHarness[key] {
			problem("the harness for %s %q matches no go block: remove it", key.file, key.first)
		}
	}
	if wrote > 0 {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		out, err := goCommand(t, root, "vet", "./"+filepath.ToSlash(rel)+"/...")
		if err != nil {
			problem("go vet on the go blocks: %v\n%s", err, vetProblems(out))
		}
	}
	sort.Strings(res.problems)
	return res
}

// harnessFor returns the key of the harness of a fragment of file: the
// longest key whose beginning the fragment (leading blank lines left out)
// starts with.
func harnessFor(hs map[blockKey]harness, file, fragment string) (blockKey, bool) {
	fragment = strings.TrimLeft(fragment, "\n")
	var best blockKey
	found := false
	for key := range hs {
		if key.file == file && strings.HasPrefix(fragment, key.first) && (!found || len(key.first) > len(best.first)) {
			best, found = key, true
		}
	}
	return best, found
}

// pageImports are the imports of an import-only block: the fragments after
// it on the page take theirs from it.
type pageImports struct {
	line  int
	specs []importSpec
	used  map[string]bool
}

// importSpec is one import: the package name a file refers to it by.
type importSpec struct {
	alias, name, path string
}

// parseSpecs parses a harness's imports ("path" or "alias path").
func parseSpecs(t *testing.T, specs []string) []importSpec {
	t.Helper()
	var out []importSpec
	for _, s := range specs {
		f := strings.Fields(s)
		switch len(f) {
		case 1:
			name := defaultPackageName(f[0])
			if !token.IsIdentifier(name) {
				t.Fatalf("harness import %q: write it as \"name %s\" (its package name cannot be guessed from the path)", s, s)
			}
			out = append(out, importSpec{name: name, path: f[0]})
		case 2:
			out = append(out, importSpec{alias: f[0], name: f[0], path: f[1]})
		default:
			t.Fatalf("harness import %q: want \"path\" or \"alias path\"", s)
		}
	}
	return out
}

var majorVersion = regexp.MustCompile(`^v[0-9]+$`)

// defaultPackageName guesses a package's name from its import path as
// goimports does: the last element that is not a major version, without a
// "go-" prefix, up to its first character that cannot be in a name
// (github.com/redis/go-redis/v9: redis).
func defaultPackageName(path string) string {
	elems := strings.Split(path, "/")
	name := elems[len(elems)-1]
	if majorVersion.MatchString(name) && len(elems) > 1 {
		name = elems[len(elems)-2]
	}
	name = strings.TrimPrefix(name, "go-")
	if i := strings.IndexFunc(name, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '_' }); i >= 0 {
		name = name[:i]
	}
	return name
}

func writeImports(w *strings.Builder, imports []importSpec) {
	if len(imports) == 0 {
		return
	}
	w.WriteString("import (\n")
	for _, imp := range imports {
		fmt.Fprintf(w, "\t%s %q\n", imp.alias, imp.path)
	}
	w.WriteString(")\n\n")
}

// splitImports separates the import declarations a block starts with from
// the rest; restLine is how many lines the imports take.
func splitImports(code string) (own []importSpec, rest string, restLine int, err error) {
	trimmed := strings.TrimLeft(code, " \t\n")
	if !strings.HasPrefix(trimmed, "import") {
		return nil, code, 0, nil
	}
	const header = "package p\n"
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", header+code, parser.ImportsOnly)
	if err != nil {
		return nil, "", 0, fmt.Errorf("its import declaration does not parse: %v", err)
	}
	last := f.Decls[len(f.Decls)-1]
	end := fset.Position(last.End()).Offset - len(header)
	nl := strings.IndexByte(code[end:], '\n')
	if nl < 0 {
		return importsOf(f), "", 0, nil
	}
	end += nl + 1
	return importsOf(f), code[end:], strings.Count(code[:end], "\n"), nil
}

func importsOf(f *ast.File) []importSpec {
	var out []importSpec
	for _, s := range f.Imports {
		p, _ := strconv.Unquote(s.Path.Value)
		imp := importSpec{path: p, name: defaultPackageName(p)}
		if s.Name != nil {
			imp.alias, imp.name = s.Name.Name, s.Name.Name
		}
		out = append(out, imp)
	}
	return out
}

// usedPackages returns the identifiers of code followed by a dot: the
// package names it may refer to.
func usedPackages(code string) map[string]bool {
	out := map[string]bool{}
	var s scanner.Scanner
	fset := token.NewFileSet()
	s.Init(fset.AddFile("", -1, len(code)), []byte(code), nil, 0)
	prev := ""
	for {
		_, tok, lit := s.Scan()
		if tok == token.EOF {
			return out
		}
		if tok == token.PERIOD && prev != "" {
			out[prev] = true
		}
		prev = ""
		if tok == token.IDENT {
			prev = lit
		}
	}
}

// mentions reports whether code has the identifier name.
func mentions(code, name string) bool {
	var s scanner.Scanner
	fset := token.NewFileSet()
	s.Init(fset.AddFile("", -1, len(code)), []byte(code), nil, 0)
	for {
		_, tok, lit := s.Scan()
		switch {
		case tok == token.EOF:
			return false
		case tok == token.IDENT && lit == name:
			return true
		}
	}
}

// declaredNames returns the names a harness's names field declares.
func declaredNames(t *testing.T, names string) []string {
	t.Helper()
	if names == "" {
		return nil
	}
	f, err := parser.ParseFile(token.NewFileSet(), "", "package p\nvar (\n"+names+"\n)\n", 0)
	if err != nil {
		t.Fatalf("harness names %q: %v", names, err)
	}
	var out []string
	for _, d := range f.Decls {
		for _, s := range d.(*ast.GenDecl).Specs {
			for _, n := range s.(*ast.ValueSpec).Names {
				out = append(out, n.Name)
			}
		}
	}
	return out
}

// isFile reports whether code starts with a package clause.
func isFile(code string) bool {
	_, err := parser.ParseFile(token.NewFileSet(), "", code, parser.PackageClauseOnly)
	return err == nil
}

// parses reports whether code parses as a file's declarations or as a
// function's statements.
func parses(code string) bool {
	if _, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+code, 0); err == nil {
		return true
	}
	_, err := parser.ParseFile(token.NewFileSet(), "", "package p\nfunc _() {\n"+code+"\n}\n", 0)
	return err == nil
}

var nonWord = regexp.MustCompile(`[^A-Za-z0-9]+`)

func sanitize(s string) string { return nonWord.ReplaceAllString(s, "_") }

func writeFile(t *testing.T, dir, name, src string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
}

// vetProblems keeps go vet's problem lines (the "vet: FILE:LINE: ..." ones,
// which name the Markdown file through //line) and drops its "# package"
// headers.
func vetProblems(out string) string {
	var keep []string
	for _, line := range strings.Split(out, "\n") {
		if line == "" || strings.HasPrefix(line, "# ") {
			continue
		}
		keep = append(keep, strings.TrimPrefix(line, "vet: "))
	}
	return strings.Join(keep, "\n")
}

// goCommand runs the go command in the repository root, bounded, and
// returns its combined output.
func goCommand(t *testing.T, root string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool(t), args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The go-block checker fails on broken input and names the Markdown file
// and line: a fragment that does not compile (through go vet and //line), a
// block without a harness, a harness name the block does not use, a
// harness no block matches, a marked fragment that does not parse, a page
// import no block uses and a fragment that uses a package its page does
// not import. The good blocks of the sample pass.
func TestGoBlockCheckerFails(t *testing.T) {
	const sample = "# Sample\n" + // 1
		"\n" + // 2
		"```go\n" + // 3
		"x := strings.ToUpper(name)\n" + // 4: x is not used
		"```\n" + // 5
		"\n" + // 6
		"```go\n" + // 7
		"y := 1\n" + // 8: no harness
		"```\n" + // 9
		"\n" + // 10
		"<!-- fragment: a signature -->\n" + // 11
		"```go\n" + // 12
		"func (\n" + // 13: does not parse
		"```\n" + // 14
		"\n" + // 15
		"```go\n" + // 16
		"package main\n" + // 17
		"\n" + // 18
		"func main() {}\n" + // 19: fine
		"```\n" + // 20
		"\n" + // 21
		"```go\n" + // 22
		"import (\n" + // 23
		"\t\"fmt\"\n" + // 24
		"\t\"os\"\n" + // 25: no block uses it
		")\n" + // 26
		"```\n" + // 27
		"\n" + // 28
		"```go\n" + // 29
		"fmt.Println(strings.TrimSpace(name))\n" + // 30: strings is not the page's
		"```\n" + // 31
		"\n" + // 32
		"```go\n" + // 33
		"fmt.Println(name)\n" + // 34: fine
		"```\n"
	m, problems := parseMarkdown("sample.md", sample)
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	hs := map[blockKey]harness{
		{"sample.md", "x := strings.ToUpper(name)"}:           {imports: []string{"strings"}, names: "name string\nunused int"},
		{"sample.md", "fmt.Println(strings.TrimSpace(name))"}: {imports: []string{"strings"}, names: "name string"},
		{"sample.md", "fmt.Println(name)"}:                    {names: "name string"},
		{"sample.md", "matches nothing"}:                      {},
	}
	res := checkGoBlocks(t, repoRoot(t), []*markdown{m}, hs, func(*markdown, fence) (bool, string) { return false, "" })
	all := strings.Join(res.problems, "\n")
	for _, want := range []string{
		"sample.md:4: declared and not used: x",
		"sample.md:3: the harness declares unused, which the go block does not use",
		`sample.md:7: a go block starting "y := 1" has no harness`,
		"sample.md:12: the go block marked as a fragment does not even parse",
		"sample.md:22: the import block imports os, which no go block after it uses",
		"sample.md:30: undefined: strings",
		`the harness for sample.md "matches nothing" matches no go block`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("the checker did not report %q; it reported:\n%s", want, all)
		}
	}
	if len(res.problems) != 6 { // the two vet errors are one problem
		t.Errorf("the checker reported %d problems, want 6:\n%s", len(res.problems), all)
	}
	if res.programs != 1 || res.importBlocks != 1 || res.marked != 1 || res.harnessed != 3 {
		t.Errorf("counted %+v", res)
	}
}
