package docs_test

import (
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Every relative link of every Markdown file reaches a file or folder of
// the repository, and every #anchor (on the same page or another) a heading
// that exists there, under GitHub's rules (githubAnchor). Links with a
// scheme (https:, mailto:) are left alone: nothing is fetched.
func TestMarkdownLinksResolve(t *testing.T) {
	repo := loadRepository(t, repoRoot(t))
	docs := repo.markdownFiles(t)
	res := checkLinks(repo, docs)
	for _, p := range res.problems {
		t.Error(p)
	}
	t.Logf("%d Markdown files: %d relative links checked (%d with an #anchor), %d external links not fetched",
		len(docs), res.relative, res.anchors, res.external)
}

type linkResult struct {
	problems                    []string
	relative, anchors, external int
}

var (
	hasScheme  = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	lineAnchor = regexp.MustCompile(`^L([0-9]+)(?:-L([0-9]+))?$`)
)

// checkLinks checks the links of docs against the files of repo.
func checkLinks(repo repository, docs []*markdown) linkResult {
	var res linkResult
	byPath := map[string]*markdown{}
	for _, m := range docs {
		byPath[m.path] = m
	}
	anchorsOf := map[string]map[string]bool{}
	anchors := func(m *markdown) map[string]bool {
		if a, ok := anchorsOf[m.path]; ok {
			return a
		}
		a := m.anchors()
		anchorsOf[m.path] = a
		return a
	}
	for _, m := range docs {
		for _, l := range m.links() {
			problem := func(format string, args ...any) {
				res.problems = append(res.problems, fmt.Sprintf("%s: link %q: %s", m.where(l.line), l.target, fmt.Sprintf(format, args...)))
			}
			if hasScheme.MatchString(l.target) {
				res.external++
				continue
			}
			res.relative++
			target, fragment, hasFragment := strings.Cut(l.target, "#")
			target, _, _ = strings.Cut(target, "?")
			p, err := url.PathUnescape(target)
			if err != nil {
				problem("%v", err)
				continue
			}
			file := m.path
			if p != "" {
				if strings.HasPrefix(p, "/") {
					file = path.Clean(strings.TrimPrefix(p, "/"))
				} else {
					file = path.Join(path.Dir(m.path), p)
				}
				if file == ".." || strings.HasPrefix(file, "../") {
					problem("leaves the repository")
					continue
				}
				if file == "." {
					file = ""
				}
				if !repo.files[file] && !repo.dirs[file] {
					problem("no file or folder %s in the repository", file)
					continue
				}
			}
			if !hasFragment {
				continue
			}
			res.anchors++
			anchor, err := url.PathUnescape(fragment)
			if err != nil {
				problem("%v", err)
				continue
			}
			if repo.dirs[file] { // GitHub shows the folder's README
				file = path.Join(file, "README.md")
			}
			if target, ok := byPath[file]; ok {
				if !anchors(target)[anchor] {
					problem("%s has no heading with the anchor #%s", file, anchor)
				}
				continue
			}
			sm := lineAnchor.FindStringSubmatch(anchor)
			if sm == nil {
				problem("#%s: %s is not a Markdown file; only #L<line> anchors work there", anchor, file)
				continue
			}
			lines, err := countLines(filepath.Join(repo.root, filepath.FromSlash(file)))
			if err != nil {
				problem("%v", err)
				continue
			}
			for _, n := range sm[1:] {
				if v, _ := strconv.Atoi(n); v > lines {
					problem("%s has %d lines", file, lines)
				}
			}
		}
	}
	return res
}

func countLines(name string) (int, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, err
	}
	return strings.Count(string(b), "\n"), nil
}

// The anchors are GitHub's: lowercase, punctuation removed, spaces to '-',
// code spans and links by their text, "-1", "-2" for repeats.
func TestGitHubAnchors(t *testing.T) {
	for heading, want := range map[string]string{
		"Quick start":                                   "quick-start",
		"Operations (`dedupctl`)":                       "operations-dedupctl",
		"Replication and failover: `WaitReplicas`":      "replication-and-failover-waitreplicas",
		"AWS Lambda (SQS, Kinesis, DynamoDB Streams)":   "aws-lambda-sqs-kinesis-dynamodb-streams",
		"The handler's rows — and the key":              "the-handlers-rows--and-the-key",
		"See [the lab](dev/lab/README.md) *now*":        "see-the-lab-now",
		"snake_case and 1.2.3":                          "snake_case-and-123",
		"Who and when: every record names its 1st copy": "who-and-when-every-record-names-its-1st-copy",
	} {
		if got := githubAnchor(heading); got != want {
			t.Errorf("githubAnchor(%q) = %q, want %q", heading, got, want)
		}
	}
	m, _ := parseMarkdown("a.md", "# Tests\n\n## Tests\n\n```sh\n# not a heading\n```\n\n### Tests ###\n<a name=\"custom\"></a>\n")
	got := m.anchors()
	for _, want := range []string{"tests", "tests-1", "tests-2", "custom"} {
		if !got[want] {
			t.Errorf("anchors %v lack %q", got, want)
		}
	}
	if got["not-a-heading"] || len(got) != 4 {
		t.Errorf("anchors %v, want tests, tests-1, tests-2 and custom", got)
	}
}

// The link checker fails on broken input, naming file and line: a missing
// file, a missing heading on the same page and on another, a link out of
// the repository, an anchor on a file that is not Markdown; it leaves
// external links, code spans and code blocks alone.
func TestLinkCheckerFails(t *testing.T) {
	const page = "# Guide\n" + // 1
		"\n" + // 2
		"See [the setup](#setup), [the store](stores/redis/README.md#usage) and\n" + // 3: no #setup
		"[the lab](cmd/lab/README.md), [upstream](https://example.com/x#y),\n" + // 4: no cmd/lab
		"[a folder](stores/redis), [its README's section](stores/redis#using-it),\n" + // 5: fine
		"[a missing one](stores/redis/README.md#missing) and [up](../outside.md).\n" + // 6: no #missing; leaves
		"Code: `[not](a-link.md)`, [the code](main.go#L2), [too far](main.go#L9), [odd](main.go#x).\n" + // 7: L9, #x
		"\n" + // 8
		"```md\n" + // 9
		"[inside a block](nowhere.md)\n" + // 10
		"```\n" + // 11
		"\n" + // 12
		"[ref]: stores/nothing.md\n" + // 13
		"## Usage\n" // 14
	const store = "# Redis\n\n## Using it\n\n## Usage\n"
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "main.go"), []byte("package main\n\nfunc main() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	repo := repository{root: root, files: map[string]bool{"guide.md": true, "stores/redis/README.md": true, "main.go": true},
		dirs: map[string]bool{"": true, "stores": true, "stores/redis": true}}
	guide, _ := parseMarkdown("guide.md", page)
	redis, _ := parseMarkdown("stores/redis/README.md", store)
	res := checkLinks(repo, []*markdown{guide, redis})
	all := strings.Join(res.problems, "\n")
	for _, want := range []string{
		`guide.md:3: link "#setup": guide.md has no heading with the anchor #setup`,
		`guide.md:4: link "cmd/lab/README.md": no file or folder cmd/lab/README.md`,
		`guide.md:6: link "stores/redis/README.md#missing": stores/redis/README.md has no heading with the anchor #missing`,
		`guide.md:6: link "../outside.md": leaves the repository`,
		`guide.md:7: link "main.go#L9": main.go has 3 lines`,
		`guide.md:7: link "main.go#x": #x: main.go is not a Markdown file`,
		`guide.md:13: link "stores/nothing.md": no file or folder stores/nothing.md`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("the checker did not report %q; it reported:\n%s", want, all)
		}
	}
	if len(res.problems) != 7 || res.external != 1 || res.relative != 11 {
		t.Errorf("%d problems, %d external, %d relative links; want 7, 1, 11:\n%s", len(res.problems), res.external, res.relative, all)
	}
}
