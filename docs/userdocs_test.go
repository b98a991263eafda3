package docs_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

// readRepoFile returns a file of the repository as text.
func readRepoFile(t *testing.T, root, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// userPages are the Markdown pages written for teams adopting the library:
// the root README, the guides in docs/ (not docs/dev/, nor the model) and
// the package and example READMEs. Maintainers' material (CONTRIBUTING.md,
// docs/dev/, docs/model/, reliability/) is not on the list.
func userPages(t *testing.T, root string) []string {
	t.Helper()
	var pages []string
	for _, pattern := range []string{"README.md", "docs/*.md", "stores/*/README.md", "stores/postgres/outbox/README.md",
		"httpdedup/README.md", "lambdadedup/README.md", "producerkey/README.md", "cmd/*/README.md", "examples/*/README.md"} {
		matches, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(pattern)))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range matches {
			rel, err := filepath.Rel(root, m)
			if err != nil {
				t.Fatal(err)
			}
			pages = append(pages, filepath.ToSlash(rel))
		}
	}
	sort.Strings(pages)
	return pages
}

// workingNotes are words that belong to the project's tracker and working
// notes, not to a user's page: issue numbers, rounds, the lab articles the
// library was written against ("seed 003"), the design notes that are not
// in the repository.
var workingNotes = regexp.MustCompile(`(?i)seed 00[0-9]|seed articles?|issue [0-9]+|this round|round-?[0-9]|DESIGN\.md`)

// notesOn returns "page:line: text" for each line of text that matches
// workingNotes.
func notesOn(page, text string) []string {
	var out []string
	for i, line := range strings.Split(text, "\n") {
		if loc := workingNotes.FindStringIndex(line); loc != nil {
			out = append(out, fmt.Sprintf("%s:%d: %q", page, i+1, line[loc[0]:loc[1]]))
		}
	}
	return out
}

// No user page speaks of issues, rounds, the lab articles or files that are
// not in the repository.
func TestUserPagesNameNoWorkingNotes(t *testing.T) {
	root := repoRoot(t)
	pages := userPages(t, root)
	if len(pages) < 20 {
		t.Fatalf("found only %d user pages: %v", len(pages), pages)
	}
	for _, page := range pages {
		for _, n := range notesOn(page, readRepoFile(t, root, page)) {
			t.Errorf("%s: working notes belong in CONTRIBUTING.md or docs/dev/", n)
		}
	}
}

// The working-notes check finds each kind, and passes a page without them
// (the lab's -seed flag and a fuzz seed corpus are what users call them).
func TestWorkingNotesCheckerFails(t *testing.T) {
	sample := "fine: -seed 1, the seed corpus\nas in seed 003's table\nsee issue 15\nthis round's code\nsee DESIGN.md\nthe round-1 figures\n"
	got := notesOn("sample.md", sample)
	want := []string{`sample.md:2: "seed 003"`, `sample.md:3: "issue 15"`, `sample.md:4: "this round"`, `sample.md:5: "DESIGN.md"`, `sample.md:6: "round-1"`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("the checker found\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// The README is a front door: at most 300 lines, and each entry point's
// guide is linked on its first screen (a Lambda user finds docs/lambda.md
// without scrolling).
func TestReadmeIsOneScreenOfDecisions(t *testing.T) {
	root := repoRoot(t)
	lines := strings.Split(strings.TrimSuffix(readRepoFile(t, root, "README.md"), "\n"), "\n")
	if len(lines) > 300 {
		t.Errorf("README.md has %d lines; keep it within 300 and move the rest to a guide in docs/", len(lines))
	}
	const firstScreen = 30
	head := strings.Join(lines[:min(firstScreen, len(lines))], "\n")
	for _, link := range []string{"(docs/lambda.md)", "(docs/http.md)", "(#quick-start)"} {
		if !strings.Contains(head, link) {
			t.Errorf("README.md links %s not within its first %d lines", link, firstScreen)
		}
	}
}

// fact is a statement made on several pages: each page must make it (a
// regular expression found in the page), and no user page may state its
// contradiction.
type fact struct {
	name          string
	says          *regexp.Regexp
	pages         []string
	contradiction *regexp.Regexp
}

var facts = []fact{
	{
		name:  "a Redis claim is SET NX PX GET, one round trip",
		says:  regexp.MustCompile("`SET key value NX PX lease GET`"),
		pages: []string{"README.md", "docs/redis.md", "stores/redis/README.md"},
		// A claim as a Lua script or a bare SET NX without GET.
		contradiction: regexp.MustCompile(`(?i)claim (is|runs) (a |one )?(Lua|EVAL)|claim is .SET key value NX PX lease.[^ ]`),
	},
	{
		name:  "a DynamoDB claim is a conditional PutItem under attribute_not_exists(pk); a takeover a conditional UpdateItem",
		says:  regexp.MustCompile("(?s)conditional `PutItem` under\\s+`attribute_not_exists\\(pk\\)`.*conditional `UpdateItem`"),
		pages: []string{"README.md", "docs/dynamodb.md", "stores/dynamo/README.md"},
		// The stores table of an earlier README: "conditional UpdateItem with ALL_OLD" as the claim.
		contradiction: regexp.MustCompile("(?i)claim[^.\n]{0,40}conditional `UpdateItem` with `ALL_OLD`|\\| conditional `UpdateItem` with `ALL_OLD` \\(1"),
	},
	{
		name:  "a PostgreSQL claim is one INSERT … ON CONFLICT DO NOTHING statement with a takeover UPDATE",
		says:  regexp.MustCompile(`ON CONFLICT\s+(\(key_hash\)\s+)?DO NOTHING`),
		pages: []string{"README.md", "docs/postgres.md", "stores/postgres/README.md"},
	},
	{
		name:  "Redis needs 7.0 or newer",
		says:  regexp.MustCompile(`Redis (≥ |)7\.0( or newer)?`),
		pages: []string{"README.md", "docs/redis.md", "stores/redis/README.md"},
		// An older floor.
		contradiction: regexp.MustCompile(`Redis (≥ ?)?[1-6]\.[0-9]+( or newer|\+)`),
	},
	{
		name:  "ReportBatchItemFailures on the SQS mapping",
		says:  regexp.MustCompile(`ReportBatchItemFailures`),
		pages: []string{"docs/lambda.md", "lambdadedup/README.md", "examples/lambda/README.md"},
	},
	{
		name:  "the Lambda deadline margin defaults to 2 s",
		says:  regexp.MustCompile("`?DeadlineMargin`?[^.\n]{0,40}\\(?(default )?\\*{0,2}2 ?s\\*{0,2}"),
		pages: []string{"docs/lambda.md", "lambdadedup/README.md", "examples/lambda/README.md"},
	},
}

// Facts stated on several pages agree: each page that should state one
// does, and no user page contradicts it.
func TestFactsAgreeAcrossPages(t *testing.T) {
	root := repoRoot(t)
	pages := userPages(t, root)
	texts := map[string]string{}
	for _, p := range pages {
		texts[p] = readRepoFile(t, root, p)
	}
	for _, f := range facts {
		for _, p := range f.pages {
			text, ok := texts[p]
			if !ok {
				t.Errorf("%s: no such user page (fact %q)", p, f.name)
				continue
			}
			if !f.says.MatchString(text) {
				t.Errorf("%s does not state that %s (looked for %s)", p, f.name, f.says)
			}
		}
		if f.contradiction == nil {
			continue
		}
		for _, p := range pages {
			if loc := f.contradiction.FindStringIndex(texts[p]); loc != nil {
				line := strings.Count(texts[p][:loc[0]], "\n") + 1
				t.Errorf("%s:%d contradicts that %s: %q", p, line, f.name, texts[p][loc[0]:loc[1]])
			}
		}
	}
}

// The fact checker fails on a page that omits a fact and on one that
// contradicts it.
func TestFactCheckerFails(t *testing.T) {
	f := facts[1] // DynamoDB
	if f.says.MatchString("The claim is a conditional `UpdateItem` with `ALL_OLD` (1 round trip).") {
		t.Error("the DynamoDB fact matched a page that does not state it")
	}
	if !f.contradiction.MatchString("| DynamoDB | `stores/dynamo` | conditional `UpdateItem` with `ALL_OLD` (1; +1 `GetItem`) |") {
		t.Error("the DynamoDB contradiction did not match the old stores table")
	}
	if !f.says.MatchString("a conditional `PutItem` under `attribute_not_exists(pk)` (1); taking over: a conditional `UpdateItem` (+1)") {
		t.Error("the DynamoDB fact did not match its statement")
	}
}

// The least IAM policy of a DynamoDB consumer is exactly the calls the
// store makes for a consumer (read from the package's source, the
// operator's admin.go and the table helpers' table.go left out), and every policy the docs show
// (the guide's table, CloudFormation, Terraform, the Lambda guide's SAM
// template) grants those and no other; the table and TTL attribute names
// in the templates are the store's defaults.
func TestDynamoDBPolicyIsWhatTheStoreCalls(t *testing.T) {
	root := repoRoot(t)
	sources, err := filepath.Glob(filepath.Join(root, "stores", "dynamo", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]bool{}
	for _, file := range sources {
		switch base := filepath.Base(file); {
		case strings.HasSuffix(base, "_test.go"), base == "admin.go", base == "table.go":
			continue // tests; the operator's calls; CreateTable and EnableTTL
		}
		src := readRepoFile(t, root, "stores/dynamo/"+filepath.Base(file))
		for _, m := range regexp.MustCompile(`\.client\.(\w+)\(`).FindAllStringSubmatch(src, -1) {
			calls["dynamodb:"+m[1]] = true
		}
	}
	want := sortedKeys(calls)
	if len(want) == 0 {
		t.Fatal("found no client calls in stores/dynamo")
	}

	guide := readRepoFile(t, root, "docs/dynamodb.md")
	lambdaGuide := readRepoFile(t, root, "docs/lambda.md")
	blocks := func(page, text, info string) []string {
		m, problems := parseMarkdown(page, text)
		for _, p := range problems {
			t.Error(p)
		}
		var out []string
		for _, b := range m.blocks {
			if b.info == info {
				out = append(out, b.code)
			}
		}
		return out
	}
	action := regexp.MustCompile(`dynamodb:[A-Za-z]+`)
	policies := map[string]string{}
	for i, b := range blocks("docs/dynamodb.md", guide, "yaml") {
		policies[fmt.Sprintf("docs/dynamodb.md yaml block %d", i+1)] = b
	}
	for i, b := range blocks("docs/dynamodb.md", guide, "hcl") {
		policies[fmt.Sprintf("docs/dynamodb.md hcl block %d", i+1)] = b
	}
	for i, b := range blocks("docs/lambda.md", lambdaGuide, "yaml") {
		policies[fmt.Sprintf("docs/lambda.md yaml block %d", i+1)] = b
	}
	if len(policies) < 3 {
		t.Fatalf("found %d policy blocks, want the CloudFormation and Terraform blocks of docs/dynamodb.md and the SAM block of docs/lambda.md", len(policies))
	}
	config := readRepoFile(t, root, "stores/dynamo/config.go")
	defaultOf := func(name string) string {
		m := regexp.MustCompile(name + `\s*=\s*"([^"]+)"`).FindStringSubmatch(config)
		if m == nil {
			t.Fatalf("stores/dynamo/config.go has no %s", name)
		}
		return m[1]
	}
	pk, ttl := defaultOf("DefaultPartitionKey"), defaultOf("DefaultTTLAttribute")
	for where, block := range policies {
		got := map[string]bool{}
		for _, a := range action.FindAllString(block, -1) {
			got[a] = true
		}
		if fmt.Sprint(sortedKeys(got)) != fmt.Sprint(want) {
			t.Errorf("%s grants %v; the store calls %v", where, sortedKeys(got), want)
		}
		for _, name := range []string{pk, ttl} {
			if !regexp.MustCompile(`(AttributeName: |name += |attribute_name += )"?` + name + `"?\b`).MatchString(block) {
				t.Errorf("%s does not name the attribute %q (the store's default)", where, name)
			}
		}
	}
	// The guide's permissions table names the same calls for a consumer.
	for _, a := range want {
		if !strings.Contains(guide, "`"+a+"`") {
			t.Errorf("docs/dynamodb.md's permissions table does not name `%s`", a)
		}
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// The PostgreSQL guide's migration SQL is the store's schema, as its README
// shows it (which stores/postgres's own test checks against Migrate).
func TestPostgresGuideShowsTheSchema(t *testing.T) {
	root := repoRoot(t)
	sqlBlock := func(page string) string {
		m, problems := parseMarkdown(page, readRepoFile(t, root, page))
		for _, p := range problems {
			t.Error(p)
		}
		for _, b := range m.blocks {
			if b.info == "sql" && strings.Contains(b.code, "CREATE TABLE") {
				return b.code
			}
		}
		t.Fatalf("%s has no sql block with CREATE TABLE", page)
		return ""
	}
	if guide, store := sqlBlock("docs/postgres.md"), sqlBlock("stores/postgres/README.md"); guide != store {
		t.Errorf("docs/postgres.md's migration SQL differs from stores/postgres/README.md's schema:\n%s\nwant\n%s", guide, store)
	}
}

// The DynamoDB guide's local program runs as the page shows: built from the
// page's Go block, run twice against a dynalite of its own (which has no
// UpdateTimeToLive, hence SkipTTL), it prints what the page shows for the
// first and the second run. The page's dedupctl evict line, run against the
// same dynalite, prints what the page shows and frees the record: a third
// run charges again, as the first did. The page's commands are a user's,
// not a checkout's: dynalite through npx, at the major version the tests
// run (tools/package.json) and on the port every command of the page uses.
func TestDynamoDBGuideRuns(t *testing.T) {
	root := repoRoot(t)
	const page = "docs/dynamodb.md"
	text := readRepoFile(t, root, page)
	m, problems := parseMarkdown(page, text)
	for _, p := range problems {
		t.Error(p)
	}
	var program string
	for _, b := range m.goBlocks() {
		if isFile(b.code) {
			program = b.code
		}
	}
	if program == "" {
		t.Fatalf("%s has no complete Go program", page)
	}
	// The page's output blocks: the lines after each `go run .` up to the
	// next command.
	var outputs []string
	for _, b := range m.blocks {
		parts := strings.Split(b.code, "$ DYNAMODB_ENDPOINT=http://127.0.0.1:8000 go run .\n")
		for _, p := range parts[1:] {
			out, _, _ := strings.Cut(p, "$ ")
			outputs = append(outputs, out)
		}
	}
	if len(outputs) != 2 {
		t.Fatalf("%s shows %d runs of the program, want 2", page, len(outputs))
	}
	const endpoint = "http://127.0.0.1:8000"
	checkDynamoDBGuideCommands(t, root, m, endpoint)
	// The evict line and what it prints, up to the next command or the end
	// of its block.
	var evictLine, evictOutput string
	for _, b := range m.blocks {
		for _, part := range strings.Split(b.code, "$ ")[1:] {
			line, out, _ := strings.Cut(part, "\n")
			if strings.Contains(line, "dedupctl ") && strings.Contains(line, " evict ") {
				evictLine, evictOutput = line, out
			}
		}
	}
	if evictLine == "" {
		t.Fatalf("%s shows no dedupctl evict command", page)
	}

	if err := os.MkdirAll(filepath.Join(root, "docs", "testdata"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(filepath.Join(root, "docs", "testdata"), "dynamolocal-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = os.RemoveAll(dir)
		_ = os.Remove(filepath.Dir(dir)) // docs/testdata, unless another run uses it
	})
	writeFile(t, dir, "main.go", program)
	rel, err := filepath.Rel(root, dir)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "dynamolocal")
	runGo(t, root, "build", "-o", bin, "./"+filepath.ToSlash(rel))

	dedupctl := filepath.Join(t.TempDir(), "dedupctl")
	runGo(t, root, "build", "-o", dedupctl, "./cmd/dedupctl")

	dynalite, err := testserver.StartDynalite()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dynalite.Close() })
	// run runs the command line with the environment variables it starts
	// with, the page's endpoint replaced with the test's dynalite.
	run := func(what string, args []string, env ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env = append(os.Environ(), env...)
		for i, e := range cmd.Env {
			cmd.Env[i] = strings.ReplaceAll(e, endpoint, dynalite.Endpoint)
		}
		got, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", what, err, got)
		}
		return string(got)
	}
	for i, want := range append(outputs, outputs[0]) {
		what := fmt.Sprintf("run %d", i+1)
		if i == 2 {
			what = "run 3, after the page's dedupctl evict"
			var env, args []string
			for _, f := range strings.Fields(evictLine) {
				switch {
				case len(args) == 0 && strings.Contains(f, "="):
					env = append(env, f)
				case len(args) == 0:
					args = append(args, dedupctl) // f is "dedupctl"
				default:
					args = append(args, f)
				}
			}
			got := run("the page's "+evictLine, args, env...)
			if left := regexp.MustCompile(`[0-9hms.]+ left`); left.ReplaceAllString(got, "… left") != left.ReplaceAllString(evictOutput, "… left") {
				t.Errorf("%q printed\n%s\nthe page shows\n%s", evictLine, got, evictOutput)
			}
		}
		if got := run(what, []string{bin}, "DYNAMODB_ENDPOINT="+endpoint); got != want {
			t.Errorf("%s printed\n%s\nwant\n%s", what, got, want)
		}
	}
}

// checkDynamoDBGuideCommands checks the commands of docs/dynamodb.md that
// the program's test does not run: every address of a local emulator is
// endpoint; dynalite is started with npx, at the major version of
// tools/package.json; the AWS CLI commands against the emulator give its
// address, with both region variables (the CLI v1 reads
// AWS_DEFAULT_REGION, the SDKs AWS_REGION) and keys set; no command needs
// a checkout of this repository.
func checkDynamoDBGuideCommands(t *testing.T, root string, m *markdown, endpoint string) {
	t.Helper()
	pkg := readRepoFile(t, root, "tools/package.json")
	major := regexp.MustCompile(`"dynalite":\s*"\^?~?([0-9]+)\.`).FindStringSubmatch(pkg)
	if major == nil {
		t.Fatal("tools/package.json names no dynalite version")
	}
	port := endpoint[strings.LastIndex(endpoint, ":")+1:]
	npx := fmt.Sprintf("npx --yes dynalite@%s --host 127.0.0.1 --port %s", major[1], port)
	checkoutOnly := []string{"npm ci --prefix tools", "tools/node_modules", "go run ./cmd/", "go run ./dev/"}
	for i, line := range m.prose {
		for _, bad := range checkoutOnly {
			if strings.Contains(line, bad) {
				t.Errorf("%s: %q works only in a checkout of this repository; give the user's command", m.where(i+1), bad)
			}
		}
	}
	var sawNpx, sawCLI bool
	for _, b := range m.blocks {
		for _, bad := range checkoutOnly {
			if strings.Contains(b.code, bad) {
				t.Errorf("%s: %q works only in a checkout of this repository; give the user's command", m.where(b.line), bad)
			}
		}
		for _, u := range regexp.MustCompile(`https?://(127\.0\.0\.1|localhost):[0-9]+`).FindAllString(b.code, -1) {
			if u != endpoint {
				t.Errorf("%s: the block uses %s; the page's emulator is at %s", m.where(b.line), u, endpoint)
			}
		}
		if strings.Contains(b.code, "dynalite") && strings.Contains(b.code, "$ ") {
			if !strings.Contains(b.code, "$ "+npx+" &\n") {
				t.Errorf("%s: the block does not start dynalite with %q", m.where(b.line), npx)
			}
			sawNpx = true
		}
		if !strings.Contains(b.code, "aws dynamodb") || !strings.Contains(b.code, "--endpoint-url") {
			continue
		}
		sawCLI = true
		for _, v := range []string{"AWS_REGION=", "AWS_DEFAULT_REGION=", "AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY="} {
			if !strings.Contains(b.code, v) {
				t.Errorf("%s: the AWS CLI commands against the emulator do not set %s", m.where(b.line), strings.TrimSuffix(v, "="))
			}
		}
		for _, line := range strings.Split(b.code, "\n") {
			if strings.HasPrefix(line, "aws ") && !strings.Contains(line, "--endpoint-url "+endpoint) {
				t.Errorf("%s: %q does not give the emulator's address (--endpoint-url %s)", m.where(b.line), line, endpoint)
			}
		}
	}
	if !sawNpx || !sawCLI {
		t.Errorf("%s: found the dynalite command: %v, AWS CLI commands against the emulator: %v; want both", m.path, sawNpx, sawCLI)
	}
}

// The README's install table names every library module of the workspace
// (go.work's modules but the tooling ones: cmd, dev, docs, examples, ops,
// internal/…, reliability; dev/release's libraryModules is the list a
// release tags), so a user knows what to go get for each store and adapter.
func TestReadmeNamesEveryLibraryModule(t *testing.T) {
	root := repoRoot(t)
	work := readRepoFile(t, root, "go.work")
	readme := readRepoFile(t, root, "README.md")
	tooling := regexp.MustCompile(`^(cmd|dev|docs|examples|ops|reliability|internal/.*)$`)
	found := 0
	for _, m := range regexp.MustCompile(`(?m)^\s+\./?(\S*)\s*$`).FindAllStringSubmatch(work, -1) {
		dir := m[1]
		if dir == "" || tooling.MatchString(dir) {
			continue
		}
		found++
		if !strings.Contains(readme, "`…/"+dir+"`") {
			t.Errorf("README.md's install table does not name the module …/%s", dir)
		}
	}
	if found < 7 {
		t.Errorf("go.work lists %d library modules besides the root; want the stores, lambdadedup, oteldedup, metrics and cmd/dedupctl", found)
	}
}

// docs/README.md is the guides' landing page: it links every guide of
// docs/ (the maintainers' docs/dev/ and docs/model/ aside), so a new
// guide is not left out of it.
func TestDocsLandingPageListsEveryGuide(t *testing.T) {
	root := repoRoot(t)
	guides, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	m, problems := parseMarkdown("docs/README.md", readRepoFile(t, root, "docs/README.md"))
	for _, p := range problems {
		t.Error(p)
	}
	linked := map[string]bool{}
	for _, l := range m.links() {
		target, _, _ := strings.Cut(l.target, "#")
		linked[target] = true
	}
	if len(guides) < 10 {
		t.Fatalf("found %d guides in docs/", len(guides))
	}
	for _, g := range guides {
		if name := filepath.Base(g); name != "README.md" && !linked[name] {
			t.Errorf("docs/README.md, the guides' landing page, does not link %s: add a line saying what it is for", name)
		}
	}
}
